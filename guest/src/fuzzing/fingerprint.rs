//! The `fingerprint` fuzz target's check.

use super::input::Input;
use crate::limits::check_fingerprint;

/// The fingerprint is canonical: `sha256:` and 64 lowercase hex digits, a
/// valid fingerprint, blind to header order and name case and method case,
/// and changed by any change to a part.
pub fn check_fingerprint_canonical(data: &[u8]) {
    let mut input = Input(data);
    let method = input.string(12);
    let path = input.string(64);
    let headers: Vec<(String, Vec<u8>)> = (0..input.u8() % 5)
        .map(|_| (input.string(12), input.bytes(12)))
        .collect();
    let body = input.bytes(256);
    let fp = crate::fingerprint::fingerprint(&method, &path, &headers, &body);
    assert_eq!(fp.len(), 71, "{fp}");
    assert!(
        fp.starts_with("sha256:")
            && fp[7..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{fp}"
    );
    assert!(check_fingerprint(&fp).is_ok());

    let mut shuffled: Vec<(String, Vec<u8>)> = headers
        .iter()
        .rev()
        .map(|(n, v)| (n.to_ascii_uppercase(), v.clone()))
        .collect();
    if !shuffled.is_empty() {
        let turn = usize::from(input.u8()) % shuffled.len();
        shuffled.rotate_left(turn);
    }
    assert_eq!(
        fp,
        crate::fingerprint::fingerprint(&method.to_ascii_lowercase(), &path, &shuffled, &body),
        "order or case changed the fingerprint"
    );

    let mut longer = body.clone();
    longer.push(input.u8());
    assert_ne!(
        fp,
        crate::fingerprint::fingerprint(&method, &path, &headers, &longer),
        "a body byte did not matter"
    );
    let moved = format!(
        "{path}{}",
        method.chars().next().map(String::from).unwrap_or_default()
    );
    if !method.is_empty() {
        let rest: String = method.chars().skip(1).collect();
        assert_ne!(
            fp,
            crate::fingerprint::fingerprint(&rest, &moved, &headers, &body),
            "moving bytes between parts did not matter"
        );
    }
    let mut more = headers.clone();
    more.push((String::new(), vec![]));
    assert_ne!(
        fp,
        crate::fingerprint::fingerprint(&method, &path, &more, &body),
        "an empty header did not matter"
    );
}
