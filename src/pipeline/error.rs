//! How a pipeline fails.

/// Why a pipeline stopped with an error.
#[derive(Debug)]
pub enum FailureKind<E> {
    /// A stage's function (or the source) returned this error, under the
    /// "raise" policy.
    Item(E),
    /// A stage under the "skip" policy failed more than `limit` times; `last`
    /// is the last error.
    TooManyFailures {
        /// The bound that was exceeded.
        limit: u64,
        /// Failures counted when it tripped.
        count: u64,
        /// The last error.
        last: E,
    },
    /// A stage's function panicked; the payload's message.
    Panicked(String),
}

/// The first failure of a pipeline, with the stage it happened in.
#[derive(Debug)]
pub struct Failure<E> {
    /// The stage's name (`"source"` for the source).
    pub stage: String,
    /// What happened.
    pub kind: FailureKind<E>,
}

pub(crate) use crate::panic::message as panic_message;

/// Errors of building or driving a pipeline (not of its items).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// The async runtime or a thread could not be started.
    #[error("could not start the pipeline: {0}")]
    Start(#[source] std::io::Error),
    /// A stage was configured with nonsense (zero concurrency, zero batch size...).
    #[error("invalid pipeline: {0}")]
    Invalid(String),
}
