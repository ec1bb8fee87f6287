//! E2B compatibility: what code written for E2B's SDKs needs from this server, so that it runs
//! against it with `E2B_API_URL=http://HOST:PORT/e2b`, `E2B_SANDBOX_URL=http://HOST:PORT/e2b/envd`
//! and one of the server's API keys as `E2B_API_KEY` (see `docs/e2b.md`).
//!
//! This tree owns the translation and the protocols, written from E2B's public specification:
//! the control API's objects and their mapping onto `Sandbox` resources ([`control`]), the
//! Connect protocol envd speaks ([`connect`]), envd's messages in JSON ([`messages`]) and their
//! binary protobuf form ([`protobuf`]), multipart uploads ([`multipart`]), signed file URLs
//! ([`signing`]) and how E2B paths and users map onto a sandbox ([`paths`]). It never
//! touches the store, Docker or a sandbox: the routes in `api/e2b` do, through the same store,
//! data plane and process supervisor as every other API, so an E2B sandbox is a `Sandbox` like
//! any other.

pub mod connect;
pub mod control;
pub mod messages;
pub mod multipart;
pub mod paths;
pub mod protobuf;
pub mod signing;
