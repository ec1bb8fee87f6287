//! Idempotency keys of creates, kept past their objects: `<data>/create-keys.json` maps a
//! namespace and key to what the create made (the object's key, uid and creation time), so that a
//! create repeated with the same key answers the same object for as long as the caller keeps
//! keys, even once that object was deleted. Records older than the horizon a caller names are
//! dropped on every write; the file is replaced crash-safely. What a record means (which answer
//! it gives) is the caller's business; nothing secret is kept here.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{atomic, Store, StoreError, StoreResult};

const FILE: &str = "create-keys.json";

/// One create made with an idempotency key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateKey {
    /// The object's store key ([`crate::resource::object_key`]).
    pub object: String,
    pub uid: String,
    pub created: DateTime<Utc>,
    /// Anything else the caller needs to answer again (e.g. the template named).
    #[serde(default)]
    pub note: String,
}

/// Serializes the file's read-modify-write cycles (creates with keys are rare and short).
static WRITES: Mutex<()> = Mutex::new(());

fn record_name(namespace: &str, key: &str) -> String {
    format!("{namespace}/{key}")
}

impl Store {
    fn create_keys_path(&self) -> PathBuf {
        self.data_dir.join(FILE)
    }

    fn read_create_keys(&self) -> BTreeMap<String, CreateKey> {
        std::fs::read(self.create_keys_path())
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    /// What a create with `key` in `namespace` made at or after `since`, if one did.
    pub fn create_key(
        &self,
        namespace: &str,
        key: &str,
        since: DateTime<Utc>,
    ) -> Option<CreateKey> {
        self.read_create_keys()
            .remove(&record_name(namespace, key))
            .filter(|record| record.created >= since)
    }

    /// Keeps what a create with `key` in `namespace` made; records made before `since` go.
    pub fn keep_create_key(
        &self,
        namespace: &str,
        key: &str,
        record: CreateKey,
        since: DateTime<Utc>,
    ) -> StoreResult<()> {
        let _serial = WRITES.lock().unwrap_or_else(|p| p.into_inner());
        let mut records = self.read_create_keys();
        records.retain(|_, kept| kept.created >= since);
        records.insert(record_name(namespace, key), record);
        let path = self.create_keys_path();
        let text = serde_json::to_vec_pretty(&records).unwrap_or_default();
        atomic::write_atomic(&path, &text).map_err(|source| StoreError::Io { path, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_found_in_its_namespace_until_the_horizon_passes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &[]).unwrap();
        let made = Utc::now();
        let record = CreateKey {
            object: "sb_1".into(),
            uid: "u1".into(),
            created: made,
            note: "base".into(),
        };
        let day = chrono::TimeDelta::hours(24);
        store
            .keep_create_key("default", "job-1", record.clone(), made - day)
            .unwrap();
        assert_eq!(
            store.create_key("default", "job-1", made - day),
            Some(record.clone())
        );
        assert_eq!(store.create_key("team-a", "job-1", made - day), None);
        assert_eq!(store.create_key("default", "job-2", made - day), None);
        // Past the horizon it is not answered, and the next write drops it.
        let later = made + chrono::TimeDelta::seconds(1);
        assert_eq!(store.create_key("default", "job-1", later), None);
        let next = CreateKey {
            object: "sb_2".into(),
            created: later,
            ..record
        };
        store
            .keep_create_key("default", "job-2", next, later)
            .unwrap();
        let reopened = Store::open(dir.path(), &[]).unwrap();
        assert_eq!(reopened.read_create_keys().len(), 1);
        assert_eq!(
            reopened
                .create_key("default", "job-2", later)
                .map(|r| r.object),
            Some("sb_2".into())
        );
    }
}
