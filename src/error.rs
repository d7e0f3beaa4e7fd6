//! The core error type. Every message starts with the name of the argument it
//! is about, so a C caller reading `unikv_last_error_message()` knows what to fix.

use thiserror::Error;

/// Errors of the core library. The FFI layer maps each variant to one status code.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    #[error("{0} is NULL")]
    NullArgument(String),
    #[error("{0}")]
    BadStructSize(String),
    #[error("{0}")]
    BadEnum(String),
    #[error("{0}")]
    BadDtype(String),
    #[error("{0}")]
    BadShape(String),
    #[error("{0}")]
    BadStride(String),
    #[error("{0}")]
    BadAlignment(String),
    #[error("{0}")]
    CapacityExceeded(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    InvalidState(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    BackendUnavailable(String),
    #[error("{0}")]
    OutOfMemory(String),
    #[error("{0}")]
    Gpu(String),
    #[error("{0}")]
    Internal(String),
    #[error("{0}")]
    InvalidHandle(String),
    #[error("{0}")]
    Overlap(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Shorthand constructors used by validation code: `bad_shape!("q", "...")`.
macro_rules! err {
    ($kind:ident, $($fmt:tt)*) => {
        $crate::error::Error::$kind(format!($($fmt)*))
    };
}
pub(crate) use err;

/// Returns early with the given error kind when `cond` is false.
macro_rules! ensure {
    ($cond:expr, $kind:ident, $($fmt:tt)*) => {
        if !($cond) {
            return Err($crate::error::err!($kind, $($fmt)*));
        }
    };
}
pub(crate) use ensure;
