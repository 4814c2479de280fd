//! Where a commit goes: the commit queue merges units of work from many callers into
//! one write transaction (`queue`); the transaction is then prepared under the writer
//! lock (`prepare`: write-buffer step, catalog, sealing, record encoding) and finished
//! in journal order (`finish`: the durable journal write, publishing the snapshot,
//! handing the pages to the flusher).

pub(crate) mod queue;

pub use queue::{QueueLimits, QueueStats};
