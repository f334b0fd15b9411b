//! The one error type of the core. The binding layer maps each variant to one Python
//! exception class (rust/src/py/errors.rs).

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A bad argument (token out of range, budget < 1, bad configuration).
    InvalidInput(String),
    /// A request id that is not live (never started, or already finished).
    UnknownRequest(String),
    /// `start_request` with an id that is still live.
    RequestExists(String),
    /// An OS operation failed: reading or writing a save file, starting a thread.
    Io(String),
    /// A file to load does not exist.
    NotFound(String),
    /// A save file is not in the expected format or version.
    Format(String),
    /// `check_invariants` found broken structure.
    Invariant(String),
    /// A bug: a panic caught at the boundary or a poisoned lock.
    Internal(String),
}

/// The variants by name, in declaration order: the binding layer's test walks this list.
pub const ERROR_KINDS: [&str; 8] = [
    "InvalidInput",
    "UnknownRequest",
    "RequestExists",
    "Io",
    "NotFound",
    "Format",
    "Invariant",
    "Internal",
];

impl Error {
    /// The variant's name, as listed in `ERROR_KINDS`.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidInput(_) => "InvalidInput",
            Error::UnknownRequest(_) => "UnknownRequest",
            Error::RequestExists(_) => "RequestExists",
            Error::Io(_) => "Io",
            Error::NotFound(_) => "NotFound",
            Error::Format(_) => "Format",
            Error::Invariant(_) => "Invariant",
            Error::Internal(_) => "Internal",
        }
    }

    /// An error of the variant named `kind` (for the binding layer's mapping test).
    pub fn of_kind(kind: &str, msg: String) -> Option<Error> {
        Some(match kind {
            "InvalidInput" => Error::InvalidInput(msg),
            "UnknownRequest" => Error::UnknownRequest(msg),
            "RequestExists" => Error::RequestExists(msg),
            "Io" => Error::Io(msg),
            "NotFound" => Error::NotFound(msg),
            "Format" => Error::Format(msg),
            "Invariant" => Error::Invariant(msg),
            "Internal" => Error::Internal(msg),
            _ => return None,
        })
    }

    pub fn message(&self) -> &str {
        match self {
            Error::InvalidInput(m)
            | Error::UnknownRequest(m)
            | Error::RequestExists(m)
            | Error::Io(m)
            | Error::NotFound(m)
            | Error::Format(m)
            | Error::Invariant(m)
            | Error::Internal(m) => m,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Error {}

impl Error {
    /// An OS error of an operation on `path`, naming both (and the errno, which the
    /// io::Error's text carries); a missing file is `NotFound`.
    pub fn io(what: &str, path: &std::path::Path, e: &std::io::Error) -> Error {
        let msg = format!("cannot {what} {}: {e}", path.display());
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::NotFound(msg)
        } else {
            Error::Io(msg)
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips() {
        for k in ERROR_KINDS {
            let e = Error::of_kind(k, "m".into()).unwrap();
            assert_eq!(e.kind(), k);
            assert_eq!(e.to_string(), "m");
        }
        assert!(Error::of_kind("Nope", String::new()).is_none());
    }
}
