//! One reason a document does not match its schema, and how its field is named to people. Apart
//! from `schema.rs` so that the checks the schema cannot express (`service.rs`) report in the
//! same form without depending on the schema module that calls them.

/// One reason a document does not match its schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// JSON pointer of the offending value, e.g. `/spec/cpus` (empty for the document root).
    pub pointer: String,
    pub message: String,
}

impl FieldError {
    /// The field as people write it: `spec.cpus`, `metadata.labels.team`, `spec.env`.
    /// List positions read as indexes: `/spec/services/1/argv` is `spec.services[1].argv`.
    pub fn field(&self) -> String {
        let mut field = String::new();
        for part in self.pointer.trim_start_matches('/').split('/') {
            if part.is_empty() {
                continue;
            }
            if !field.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
                field.push_str(&format!("[{part}]"));
            } else {
                if !field.is_empty() {
                    field.push('.');
                }
                field.push_str(part);
            }
        }
        if field.is_empty() {
            "(document)".to_string()
        } else {
            field
        }
    }
}
