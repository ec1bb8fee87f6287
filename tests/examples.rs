//! Every manifest under `examples/` parses and validates: the README points people at them.

use std::path::Path;

#[test]
fn every_example_is_a_valid_manifest() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut documents = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let parsed =
            agent_sandbox::resource::yaml::parse_file(&std::fs::read(&path).unwrap(), &path);
        assert!(
            parsed.errors.is_empty(),
            "{}: {:?}",
            path.display(),
            parsed.errors
        );
        assert!(
            !parsed.documents.is_empty(),
            "{} holds no document",
            path.display()
        );
        documents += parsed.documents.len();
    }
    assert!(
        documents >= 5,
        "expected the examples of every kind, found {documents} documents"
    );
}
