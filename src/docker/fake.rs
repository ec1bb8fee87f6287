//! An in-memory [`Engine`] for unit tests of the controller: it records calls and keeps containers
//! and volumes in maps. It has no data plane.
