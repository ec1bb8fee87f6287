//! The `/v1` wire contract of agent-sandbox 0.2.1, on top of the store (lifecycle) and the data
//! plane (exec and files).
