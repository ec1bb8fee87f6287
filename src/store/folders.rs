//! Reading manifest folders: scanning `*.yaml`/`*.yml` files (recursively) into documents and
//! errors, and watching them for changes with notify, debounced.
