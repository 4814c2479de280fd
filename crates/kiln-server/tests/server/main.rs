//! kiln-server's integration tests, one module per subject, in one test binary:
//! each file was a binary of its own, and each linked the whole server and
//! instantiated its generic stack again (19 binaries, 570 s of a 2-core build's
//! 1,667 s of compile units; `cargo build --timings`). Run one subject with
//! `cargo test -p kiln-server --test server -- http_api::`.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

mod api_keys_over_http;
mod attachments_sealed;
mod backup_endpoint;
mod bulk_insert;
mod changes_feed;
mod changes_websocket_takes_key_as_subprotocol;
mod client_error_codes;
mod disk_full;
mod front_door_layers;
mod http_api;
mod limits;
mod openapi_matches_server;
mod own_http1;
mod own_loop_matches_router;
mod permissions;
mod queries;
mod revisions;
mod studio_is_served_from_the_binary;
mod tls_auth;
