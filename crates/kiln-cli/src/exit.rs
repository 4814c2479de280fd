//! Exit codes, the same for every command, in one place (docs/cli.md, "Exit
//! codes"): a script can tell a server that is down from a database that is
//! missing from a request the server refused.

use crate::client::ClientError;
use std::error::Error;

/// Any other failure: a file that cannot be read or written, a check that found a
/// problem, a data directory in use, an answer the CLI did not expect.
pub const FAILED: u8 = 1;
/// The command line cannot be right: clap's own errors (an unknown flag), and
/// [`crate::UsageError`] (a missing or conflicting option, a `--url` that is no
/// http:// or https:// URL, `--params` that is not JSON).
pub const USAGE: u8 = 2;
/// No answer from the server: the host does not resolve, the connection is
/// refused or cut, the TLS handshake fails, the answer does not come in time.
pub const CANNOT_CONNECT: u8 = 3;
/// What was asked for does not exist: a 404 from the server (a database, a
/// document, an attachment, a subscription), or a document `kiln get` does not
/// find, a data directory that does not exist.
pub const NOT_FOUND: u8 = 4;
/// The server refused the request as it was: a 4xx other than 404, 409 and 412
/// (a bad query, an invalid document, 401/403 without the right key, 413).
pub const REFUSED: u8 = 5;
/// A conflict: 409 or 412 (an `If-Match` that no longer holds, a database that
/// exists already, a subscription held by another worker).
pub const CONFLICT: u8 = 6;
/// The server failed: a 5xx (501 included: the server does not do that).
pub const SERVER_ERROR: u8 = 7;

/// The exit code of a request answered `status` (not 2xx).
pub fn for_status(status: u16) -> u8 {
    match status {
        404 | 410 => NOT_FOUND,
        409 | 412 => CONFLICT,
        400..=499 => REFUSED,
        500..=599 => SERVER_ERROR,
        _ => FAILED,
    }
}

/// The exit code of a client error.
pub fn for_client(e: &ClientError) -> u8 {
    match e {
        ClientError::Url(_) => USAGE,
        ClientError::Status { status, .. } => for_status(*status),
        ClientError::Connect { .. }
        | ClientError::Handshake { .. }
        | ClientError::Http { .. }
        | ClientError::Timeout { .. } => CANNOT_CONNECT,
        ClientError::Io { .. } | ClientError::Tls(_) | ClientError::Request { .. } => FAILED,
    }
}

/// The exit code of a command's error: that of the first error in its chain of
/// causes the CLI knows ([`crate::UsageError`], [`ClientError`], [`NotFound`]),
/// else [`FAILED`].
pub fn of(e: &(dyn Error + 'static)) -> u8 {
    let mut cause: Option<&(dyn Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.is::<crate::UsageError>() {
            return USAGE;
        }
        if let Some(client) = c.downcast_ref::<ClientError>() {
            return for_client(client);
        }
        if c.is::<NotFound>() {
            return NOT_FOUND;
        }
        if let Some(kiln_docs::DocError::Database(kiln_docs::DatabaseError::NotFound(_))) =
            c.downcast_ref::<kiln_docs::DocError>()
        {
            return NOT_FOUND;
        }
        cause = c.source();
    }
    FAILED
}

/// Something asked for that is not there, found without a server (a data
/// directory, a database or a document of `kiln get`): exit code [`NOT_FOUND`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotFound(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_have_their_classes() {
        assert_eq!(for_status(404), NOT_FOUND);
        assert_eq!(for_status(400), REFUSED);
        assert_eq!(for_status(401), REFUSED);
        assert_eq!(for_status(409), CONFLICT);
        assert_eq!(for_status(412), CONFLICT);
        assert_eq!(for_status(500), SERVER_ERROR);
        assert_eq!(for_status(501), SERVER_ERROR);
        assert_eq!(for_status(302), FAILED);
    }

    #[test]
    fn the_chain_is_searched() {
        #[derive(Debug, thiserror::Error)]
        #[error("wrapped")]
        struct Wrapped(#[source] ClientError);
        let e = Wrapped(ClientError::Status {
            status: 404,
            body: String::new(),
        });
        assert_eq!(of(&e), NOT_FOUND);
        let boxed: Box<dyn Error> = "plain".into();
        assert_eq!(of(boxed.as_ref()), FAILED);
        let usage: Box<dyn Error> = Box::new(crate::UsageError("x".into()));
        assert_eq!(of(usage.as_ref()), USAGE);
    }
}
