//! Checkpoint manifests and settings: the wire form of what the state
//! holds, and an agent's upload checked field by field.

use muster_proto::v1;
use tonic::Status;

use super::invalid;
use crate::sm::{CheckpointManifest, CheckpointSettings, CheckpointStore, MAX_CHECKPOINT_KEY_BYTES, ManifestUpload};

/// The wire form of a manifest.
pub fn manifest_to_proto(m: &CheckpointManifest) -> v1::CheckpointManifest {
    v1::CheckpointManifest {
        seq: m.seq,
        epoch: m.epoch,
        attempt: m.attempt,
        saved_at_ms: m.saved_at_ms,
        step: m.step,
        bytes: m.bytes,
        sha256: m.sha256.to_vec(),
        writer: m.writer.to_string(),
        store: m.store.spec(),
        key: m.key.clone(),
    }
}

/// An agent's manifest, checked: a 32-byte digest, a store spelling, a key
/// within its length (which task it names, and whether the allocation may
/// use the store, the state checks).
pub fn upload_from_proto(m: Option<v1::CheckpointManifest>) -> Result<ManifestUpload, Status> {
    let m = m.ok_or_else(|| invalid("manifest", "is required (checkpoint bytes never travel to the leader)"))?;
    let sha256: [u8; 32] = m
        .sha256
        .as_slice()
        .try_into()
        .map_err(|_| invalid("manifest.sha256", format!("{} bytes, not 32", m.sha256.len())))?;
    let store = CheckpointStore::parse(&m.store).map_err(|e| invalid("manifest.store", e))?;
    if m.key.len() > MAX_CHECKPOINT_KEY_BYTES {
        return Err(invalid("manifest.key", format!("{} bytes, over {MAX_CHECKPOINT_KEY_BYTES}", m.key.len())));
    }
    Ok(ManifestUpload { step: m.step, bytes: m.bytes, sha256, store, key: m.key })
}

/// The wire form of the settings, with the counts of retired checkpoints.
pub fn settings_to_proto(s: &CheckpointSettings, retired: usize, abandoned: u64) -> v1::CheckpointSettings {
    v1::CheckpointSettings {
        store: s.store.spec(),
        keep: s.keep,
        max_bytes: s.max_bytes,
        retired: retired as u64,
        abandoned,
    }
}

/// Settings as an admin sent them, checked (the counts are read only).
pub fn settings_from_proto(p: v1::CheckpointSettings) -> Result<CheckpointSettings, Status> {
    let store = CheckpointStore::parse(&p.store).map_err(|e| invalid("store", e))?;
    let s = CheckpointSettings { store, keep: p.keep, max_bytes: p.max_bytes };
    s.check().map_err(|e| invalid("settings", e))?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upload_names_its_bad_field() {
        let good = v1::CheckpointManifest {
            bytes: 10,
            sha256: vec![1; 32],
            store: "node".into(),
            key: "alloc-1/task-0/c".into(),
            ..Default::default()
        };
        assert!(upload_from_proto(Some(good.clone())).is_ok());
        let cases = [
            (None, "manifest: is required"),
            (Some(v1::CheckpointManifest { sha256: vec![1; 31], ..good.clone() }), "manifest.sha256"),
            (Some(v1::CheckpointManifest { store: "ftp://x".into(), ..good.clone() }), "manifest.store"),
            (Some(v1::CheckpointManifest { key: "k".repeat(300), ..good.clone() }), "manifest.key"),
        ];
        for (m, field) in cases {
            let st = upload_from_proto(m).unwrap_err();
            assert_eq!(st.code(), tonic::Code::InvalidArgument);
            assert!(st.message().contains(field), "{field}: {st:?}");
        }
    }

    #[test]
    fn settings_are_checked_at_the_edge() {
        let ok =
            v1::CheckpointSettings { store: "/mnt/ckpt".into(), keep: 3, max_bytes: 1 << 30, ..Default::default() };
        assert_eq!(settings_from_proto(ok.clone()).unwrap().keep, 3);
        for (bad, says) in [
            (v1::CheckpointSettings { store: "mnt".into(), ..ok.clone() }, "invalid store"),
            (v1::CheckpointSettings { keep: 0, ..ok.clone() }, "keep"),
            (v1::CheckpointSettings { max_bytes: 0, ..ok }, "1 MiB"),
        ] {
            let st = settings_from_proto(bad).unwrap_err();
            assert!(st.message().contains(says), "{says}: {st:?}");
        }
    }
}
