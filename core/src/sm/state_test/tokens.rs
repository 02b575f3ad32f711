//! Bearer tokens in the state: created with a hash only, revoked once,
//! validated, in the snapshot and the digest.

use super::*;

fn create(id: &str, name: &str, expires_ms: u64) -> Command {
    Command::CreateToken {
        id: id.into(),
        name: name.into(),
        role: TokenRole::Client,
        sha256: [7; 32],
        expires_ms,
        by: "alice".into(),
    }
}

fn apply(s: &mut State, cmd: &Command, t: u64) -> Outcome {
    s.apply(cmd, &ApplyCtx { time_ms: t })
}

#[test]
fn tokens_are_created_revoked_once_and_kept_in_the_snapshot() {
    let mut s = State::default();
    let out = apply(&mut s, &create("t1", "bob", 10_000), 1_000);
    assert_eq!(
        out.events(),
        &[Event::TokenCreated { id: "t1".into(), name: "bob".into(), role: TokenRole::Client, by: "alice".into() }]
    );
    let t = s.token("t1").unwrap();
    assert_eq!((t.sha256, t.created_ms, t.expires_ms, t.revoked.clone()), ([7; 32], 1_000, 10_000, None));
    let digest = s.state_digest();
    assert!(matches!(apply(&mut s, &create("t1", "eve", 10_000), 1_000), Outcome::Rejected(Rejection::TokenExists(_))));
    assert_eq!(s.state_digest(), digest, "a rejection changes nothing");

    let revoke = Command::RevokeToken { id: "t1".into(), by: "alice".into() };
    assert_eq!(apply(&mut s, &revoke, 2_000).events(), &[Event::TokenRevoked { id: "t1".into(), by: "alice".into() }]);
    assert_eq!(s.token("t1").unwrap().revoked, Some((2_000, "alice".into())));
    assert!(matches!(apply(&mut s, &revoke, 2_001), Outcome::Rejected(Rejection::TokenRevoked(_))));
    let unknown = Command::RevokeToken { id: "nope".into(), by: "alice".into() };
    assert!(matches!(apply(&mut s, &unknown, 2_002), Outcome::Rejected(Rejection::UnknownToken(_))));

    let back = State::from_snapshot(&s.to_snapshot()).unwrap();
    assert_eq!(back.token("t1"), s.token("t1"));
    assert_eq!(back.state_digest(), s.state_digest());
}

#[test]
fn malformed_tokens_are_refused_with_the_field_named() {
    let mut s = State::default();
    for (cmd, field) in [
        (create("", "bob", 10_000), "id"),
        (create("UPPER", "bob", 10_000), "id"),
        (create("t1", "", 10_000), "name"),
        (create("t1", "bob smith", 10_000), "name"),
        (create("t1", "bob", 500), "ttl"),
    ] {
        match apply(&mut s, &cmd, 1_000) {
            Outcome::Rejected(Rejection::InvalidToken { field: f, .. }) => assert_eq!(f, field, "{cmd:?}"),
            other => panic!("{cmd:?}: {other:?}"),
        }
    }
    assert_eq!(s.tokens().count(), 0);
}

#[test]
fn the_state_keeps_at_most_max_tokens() {
    let mut s = State::default();
    for i in 0..crate::sm::MAX_TOKENS {
        assert!(apply(&mut s, &create(&format!("t{i}"), "bob", 10_000), 1_000).is_accepted());
    }
    match apply(&mut s, &create("tmore", "bob", 10_000), 1_000) {
        Outcome::Rejected(Rejection::InvalidToken { field, reason }) => {
            assert_eq!(field, "tokens");
            assert!(reason.contains("10000 tokens"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}
