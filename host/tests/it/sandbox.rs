//! The sandbox, proven from the shipped bytes: the component imports the
//! guard's own interfaces and nothing else, so it has no way to reach a
//! filesystem, a network, environment variables, a clock other than the
//! host's, or randomness. A component can only call what it imports.

use std::collections::BTreeSet;
use wasmtime::component::Component;
use wasmtime::{Config, Engine};

fn engine() -> Engine {
    Engine::new(&Config::new()).unwrap()
}

fn imports_and_exports(bytes: &[u8]) -> (BTreeSet<String>, BTreeSet<String>) {
    let engine = engine();
    let component = Component::new(&engine, bytes).expect("the component compiles");
    let ty = component.component_type();
    let imports = ty
        .imports(&engine)
        .map(|(name, _)| name.to_owned())
        .collect();
    let exports = ty
        .exports(&engine)
        .map(|(name, _)| name.to_owned())
        .collect();
    (imports, exports)
}

#[test]
fn the_shipped_component_imports_only_the_guard_interfaces() {
    let (imports, exports) = imports_and_exports(idem::COMPONENT);
    let allowed: BTreeSet<String> = [
        "idem:guard/clock@0.3.0",
        "idem:guard/random@0.3.0",
        "idem:guard/store@0.3.0",
        "idem:guard/types@0.3.0",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert!(
        imports.is_subset(&allowed),
        "the component imports more than the guard interfaces: {:?}",
        imports.difference(&allowed).collect::<Vec<_>>()
    );
    assert!(
        imports.contains("idem:guard/store@0.3.0")
            && imports.contains("idem:guard/clock@0.3.0")
            && imports.contains("idem:guard/random@0.3.0"),
        "{imports:?}"
    );
    assert!(
        !imports.iter().any(|name| name.starts_with("wasi:")),
        "no WASI: {imports:?}"
    );
    assert!(exports.contains("idem:guard/guard@0.3.0"), "{exports:?}");
}

/// The check can fail: a component that imports a WASI interface is seen.
/// (Hand-encoded: one empty instance type, imported as
/// `wasi:filesystem/preopens@0.2.0`.)
#[test]
fn a_component_importing_wasi_would_be_caught() {
    let name = b"wasi:filesystem/preopens@0.2.0";
    let mut bytes = b"\0asm\x0d\x00\x01\x00".to_vec();
    bytes.extend([0x07, 0x03, 0x01, 0x42, 0x00]); // type section: instance type with no declarations
    let mut import = vec![0x01, 0x00, name.len() as u8];
    import.extend(name);
    import.extend([0x05, 0x00]); // an instance of type 0
    bytes.extend([0x0a, import.len() as u8]);
    bytes.extend(import);
    let (imports, _) = imports_and_exports(&bytes);
    assert_eq!(
        imports,
        BTreeSet::from(["wasi:filesystem/preopens@0.2.0".to_owned()])
    );
}
