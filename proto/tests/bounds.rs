//! Every field a peer can send has a limit, and the limit is enforced.
//!
//! The test walks the compiled descriptors from every RPC's request type
//! (the agent stream's messages included): each string, bytes, map and
//! repeated field it reaches must have a row in `bounds::LIMITS`. Then, for
//! each row, it encodes a request with that one field just over its limit,
//! and again exactly at it, by hand on the wire, decodes it as the server
//! would, and checks that `check_bounds` refuses the first, naming the
//! field, and lets the second through. A new field without a limit, or a
//! limit the code does not enforce, fails here.

use std::collections::{BTreeMap, BTreeSet};

use muster_proto::bounds::{Bounded, LIMITS, Limit, OutOfBounds};
use muster_proto::{FILE_DESCRIPTOR_SET, v1};
use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};

type Decode = fn(&[u8]) -> Result<(), OutOfBounds>;

fn decode<M: Message + Default + Bounded>(b: &[u8]) -> Result<(), OutOfBounds> {
    M::decode(b).expect("the test encodes valid protobuf").check_bounds()
}

/// How the servers decode and check each request type.
fn decoders() -> BTreeMap<&'static str, Decode> {
    BTreeMap::from([
        ("AgentMessage", decode::<v1::AgentMessage> as Decode),
        ("FetchCheckpoint", decode::<v1::FetchCheckpoint>),
        ("RaftPayload", decode::<v1::RaftPayload>),
        ("FollowRequest", decode::<v1::FollowRequest>),
        ("PreVoteRequest", decode::<v1::PreVoteRequest>),
        ("SubmitRequest", decode::<v1::SubmitRequest>),
        ("GetRequest", decode::<v1::GetRequest>),
        ("ListRequest", decode::<v1::ListRequest>),
        ("CancelRequest", decode::<v1::CancelRequest>),
        ("SetArrayThrottleRequest", decode::<v1::SetArrayThrottleRequest>),
        ("SubmitWorkflowRequest", decode::<v1::SubmitWorkflowRequest>),
        ("WatchRequest", decode::<v1::WatchRequest>),
        ("LogsRequest", decode::<v1::LogsRequest>),
        ("ListNodesRequest", decode::<v1::ListNodesRequest>),
        ("GetNodeRequest", decode::<v1::GetNodeRequest>),
        ("DrainNodeRequest", decode::<v1::DrainNodeRequest>),
        ("NodeActionRequest", decode::<v1::NodeActionRequest>),
        ("ScaleDownRequest", decode::<v1::ScaleDownRequest>),
        ("WatchNodesRequest", decode::<v1::WatchNodesRequest>),
        ("AdmitNodeRequest", decode::<v1::AdmitNodeRequest>),
        ("LabelNodeRequest", decode::<v1::LabelNodeRequest>),
        ("PrefetchImageRequest", decode::<v1::PrefetchImageRequest>),
        ("StatusRequest", decode::<v1::StatusRequest>),
        ("AddLearnerRequest", decode::<v1::AddLearnerRequest>),
        ("ChangeMembershipRequest", decode::<v1::ChangeMembershipRequest>),
        ("CreateTokenRequest", decode::<v1::CreateTokenRequest>),
        ("RevokeTokenRequest", decode::<v1::RevokeTokenRequest>),
        ("BackupRequest", decode::<v1::BackupRequest>),
        ("CheckpointSettings", decode::<v1::CheckpointSettings>),
        ("VClusterRequest", decode::<v1::VClusterRequest>),
        ("GetVClusterRequest", decode::<v1::GetVClusterRequest>),
        ("ListVClustersRequest", decode::<v1::ListVClustersRequest>),
        ("HistoryQuery", decode::<v1::HistoryQuery>),
        ("UsageQuery", decode::<v1::UsageQuery>),
        ("FetchRecordsRequest", decode::<v1::FetchRecordsRequest>),
    ])
}

/// A bounded field as the descriptors describe it.
#[derive(Clone, Debug)]
struct Field {
    /// The request type it is reached from, and the field numbers leading
    /// to the message that holds it.
    root: String,
    path: Vec<i32>,
    number: i32,
    kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Text,
    Strings,
    Map,
    Messages,
    Scalars,
}

struct Descriptors {
    messages: BTreeMap<String, DescriptorProto>,
    roots: BTreeSet<String>,
}

fn short(full: &str) -> String {
    full.trim_start_matches(".muster.v1.").to_string()
}

fn descriptors() -> Descriptors {
    let set = FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).unwrap();
    let mut messages = BTreeMap::new();
    fn add(prefix: &str, m: &DescriptorProto, into: &mut BTreeMap<String, DescriptorProto>) {
        let name = format!("{prefix}.{}", m.name());
        for n in &m.nested_type {
            add(&name, n, into);
        }
        into.insert(name, m.clone());
    }
    let mut roots = BTreeSet::new();
    for f in &set.file {
        for m in &f.message_type {
            add(&format!(".{}", f.package()), m, &mut messages);
        }
        for s in &f.service {
            for method in &s.method {
                roots.insert(method.input_type().to_string());
            }
        }
    }
    Descriptors { messages, roots }
}

/// Every bounded field reachable from a request type, by `Message.field`.
fn bounded_fields(d: &Descriptors) -> BTreeMap<String, Field> {
    let mut out = BTreeMap::new();
    for root in &d.roots {
        let mut stack = vec![(root.clone(), Vec::new())];
        let mut seen = BTreeSet::new();
        while let Some((name, path)) = stack.pop() {
            if !seen.insert(name.clone()) {
                continue;
            }
            let m = &d.messages[&name];
            for f in &m.field {
                let repeated = f.label() == Label::Repeated;
                let is_map = f.r#type() == Type::Message
                    && d.messages[f.type_name()].options.as_ref().is_some_and(|o| o.map_entry());
                let kind = match (f.r#type(), repeated) {
                    (Type::Message, true) if is_map => Some(Kind::Map),
                    (Type::Message, true) => Some(Kind::Messages),
                    (Type::String, true) => Some(Kind::Strings),
                    (Type::String | Type::Bytes, false) => Some(Kind::Text),
                    (_, true) => Some(Kind::Scalars),
                    _ => None,
                };
                if let Some(kind) = kind {
                    let key = format!("{}.{}", short(&name), f.name());
                    out.entry(key).or_insert(Field { root: short(root), path: path.clone(), number: f.number(), kind });
                }
                if f.r#type() == Type::Message && !is_map {
                    let mut p = path.clone();
                    p.push(f.number());
                    stack.push((f.type_name().to_string(), p));
                }
            }
        }
    }
    out
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn len_field(number: i32, body: &[u8], out: &mut Vec<u8>) {
    varint(((number as u64) << 3) | 2, out);
    varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

fn map_entry(number: i32, key: &str, value: &str, out: &mut Vec<u8>) {
    let mut e = Vec::new();
    len_field(1, key.as_bytes(), &mut e);
    len_field(2, value.as_bytes(), &mut e);
    len_field(number, &e, out);
}

/// The field's encoding with `count` entries (a text field: `count`
/// bytes), or one entry of `bytes` bytes when `count` is None.
fn encode(f: &Field, count: usize, one_of_bytes: Option<usize>) -> Vec<u8> {
    let mut body = Vec::new();
    match (f.kind, one_of_bytes) {
        (Kind::Text, _) => len_field(f.number, &vec![b'x'; count], &mut body),
        (Kind::Strings, Some(b)) => len_field(f.number, &vec![b'x'; b], &mut body),
        (Kind::Strings, None) | (Kind::Messages, _) => (0..count).for_each(|_| len_field(f.number, &[], &mut body)),
        (Kind::Map, Some(b)) => map_entry(f.number, &"k".repeat(b), "", &mut body),
        (Kind::Map, None) => (0..count).for_each(|i| map_entry(f.number, &format!("{i}"), "", &mut body)),
        (Kind::Scalars, _) => (0..count).for_each(|_| {
            varint((f.number as u64) << 3, &mut body);
            varint(1, &mut body);
        }),
    }
    for &n in f.path.iter().rev() {
        let mut outer = Vec::new();
        len_field(n, &body, &mut outer);
        body = outer;
    }
    body
}

#[test]
fn every_field_a_peer_can_send_has_a_limit() {
    let d = descriptors();
    let fields = bounded_fields(&d);
    let rows: BTreeSet<&str> = LIMITS.iter().map(|(f, _)| *f).collect();
    let missing: Vec<&String> = fields.keys().filter(|f| !rows.contains(f.as_str())).collect();
    assert!(missing.is_empty(), "request fields without a limit in muster_proto::bounds::LIMITS: {missing:?}");
    let stale: Vec<&&str> = rows.iter().filter(|r| !fields.contains_key(**r)).collect();
    assert!(stale.is_empty(), "LIMITS rows naming no request field: {stale:?}");
    assert_eq!(rows.len(), LIMITS.len(), "a field has two rows");
    let decoders = decoders();
    let roots: BTreeSet<String> = d.roots.iter().map(|r| short(r)).collect();
    let undecoded: Vec<&String> = roots.iter().filter(|r| !decoders.contains_key(r.as_str())).collect();
    assert!(undecoded.is_empty(), "request types with no Bounded check: {undecoded:?}");
}

#[test]
fn every_limit_is_enforced_at_exactly_its_value() {
    let d = descriptors();
    let fields = bounded_fields(&d);
    let decoders = decoders();
    for (name, limit) in LIMITS {
        let f = &fields[*name];
        let check = decoders[f.root.as_str()];
        let refused = |bytes: Vec<u8>, what: &str| match check(&bytes) {
            Err(e) => assert_eq!(e.field, *name, "{what}: the error names another field: {e}"),
            Ok(()) => panic!("{name}: {what} was let through"),
        };
        let allowed = |bytes: Vec<u8>, what: &str| {
            if let Err(e) = check(&bytes) {
                panic!("{name}: {what} was refused: {e}");
            }
        };
        match *limit {
            Limit::Bytes(n) => {
                assert_eq!(f.kind, Kind::Text, "{name} is not a text field");
                refused(encode(f, n + 1, None), &format!("{} bytes", n + 1));
                allowed(encode(f, n, None), &format!("{n} bytes"));
            }
            Limit::Items { items, bytes } => {
                assert_ne!(f.kind, Kind::Text, "{name} is not repeated");
                refused(encode(f, items + 1, None), &format!("{} entries", items + 1));
                allowed(encode(f, items, None), &format!("{items} entries"));
                match f.kind {
                    Kind::Strings | Kind::Map => {
                        assert!(bytes > 0, "{name} holds strings: it needs a byte limit");
                        refused(encode(f, 1, Some(bytes + 1)), &format!("{} bytes", bytes + 1));
                        allowed(encode(f, 1, Some(bytes)), &format!("{bytes} bytes"));
                    }
                    _ => assert_eq!(bytes, 0, "{name} holds no strings: its byte limit means nothing"),
                }
            }
        }
    }
}

#[test]
fn an_error_echoes_only_a_short_prefix_of_the_value() {
    let spec = v1::AllocationSpec { pack_by: "rack".repeat(1 << 20), ..Default::default() };
    let e = v1::SubmitRequest { spec: Some(spec), ..Default::default() }.check_bounds().unwrap_err();
    assert_eq!(e.field, "AllocationSpec.pack_by");
    let status: tonic::Status = e.into();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().len() < 200, "{}", status.message());
    assert!(status.message().contains("4194304 bytes"), "{}", status.message());
}
