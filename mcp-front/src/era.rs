//! MCP protocol versions and the two eras of the streamable HTTP transport (legacy: sessions,
//! GET stream, resumption; modern 2026-07-28: stateless). Pure; decides only which version a
//! request speaks, from its `MCP-Protocol-Version` header and what the session negotiated.
#![forbid(unsafe_code)]

use std::fmt;

/// The protocol versions the gateway fronts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    V2025_03_26,
    V2025_06_18,
    V2025_11_25,
    V2026_07_28,
}

/// Which transport rules apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    Legacy,
    Modern,
}

pub const SUPPORTED: [Version; 4] = [
    Version::V2025_03_26,
    Version::V2025_06_18,
    Version::V2025_11_25,
    Version::V2026_07_28,
];

impl Version {
    pub fn parse(s: &str) -> Option<Version> {
        SUPPORTED.into_iter().find(|v| v.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Version::V2025_03_26 => "2025-03-26",
            Version::V2025_06_18 => "2025-06-18",
            Version::V2025_11_25 => "2025-11-25",
            Version::V2026_07_28 => "2026-07-28",
        }
    }

    pub fn era(self) -> Era {
        match self {
            Version::V2026_07_28 => Era::Modern,
            _ => Era::Legacy,
        }
    }

    /// JSON-RPC batches in POST bodies exist only in 2025-03-26.
    pub fn allows_batch(self) -> bool {
        self == Version::V2025_03_26
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the version header was refused (→ 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionError {
    /// Present but not one of [`SUPPORTED`] (or not UTF-8).
    Unsupported(String),
}

/// The version a request speaks: the header if present (must be supported); else the session's
/// negotiated version; else 2025-03-26 (spec: "the server SHOULD assume protocol version
/// 2025-03-26" when it has no other way to tell).
pub fn request_version(
    header: Option<&[u8]>,
    negotiated: Option<Version>,
) -> Result<Version, VersionError> {
    match header {
        Some(raw) => {
            let s = std::str::from_utf8(raw).map_err(|_| {
                VersionError::Unsupported(String::from_utf8_lossy(raw).into_owned())
            })?;
            Version::parse(s).ok_or_else(|| VersionError::Unsupported(s.to_owned()))
        }
        None => Ok(negotiated.unwrap_or(Version::V2025_03_26)),
    }
}

/// The supported list, for error bodies.
pub fn supported_list() -> Vec<&'static str> {
    SUPPORTED.iter().map(|v| v.as_str()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC-NOTES L6: header missing → negotiated version, else 2025-03-26.
    #[test]
    fn missing_header_falls_back() {
        assert_eq!(request_version(None, None), Ok(Version::V2025_03_26));
        assert_eq!(
            request_version(None, Some(Version::V2025_11_25)),
            Ok(Version::V2025_11_25)
        );
    }

    /// SPEC-NOTES L6: unsupported / invalid → error (the core answers 400).
    #[test]
    fn unsupported_header_is_error() {
        assert_eq!(
            request_version(Some(b"2024-11-05"), None),
            Err(VersionError::Unsupported("2024-11-05".into()))
        );
        assert!(request_version(Some(b"2025-11-25 "), None).is_err());
        assert!(request_version(Some(b"\xff"), None).is_err());
        assert_eq!(
            request_version(Some(b"2025-06-18"), Some(Version::V2025_11_25)),
            Ok(Version::V2025_06_18)
        );
    }

    #[test]
    fn eras_and_batches() {
        assert_eq!(Version::V2026_07_28.era(), Era::Modern);
        for v in [
            Version::V2025_03_26,
            Version::V2025_06_18,
            Version::V2025_11_25,
        ] {
            assert_eq!(v.era(), Era::Legacy);
            assert_eq!(Version::parse(v.as_str()), Some(v));
        }
        assert!(Version::V2025_03_26.allows_batch());
        assert!(!Version::V2025_06_18.allows_batch());
        assert!(!Version::V2026_07_28.allows_batch());
    }
}
