//! Opening an environment: `scan` reads the journal back (torn tails, gaps),
//! `replay` applies what it finds to the data file and the write buffer, `create`
//! makes a new environment or reads an existing one's file header.

pub(crate) mod create;
pub(crate) mod replay;
pub(crate) mod scan;

pub use scan::JournalTail;
