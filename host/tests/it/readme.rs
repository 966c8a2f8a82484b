//! The README's and the book's command blocks, as a newcomer runs them:
//! every ```sh block of `README.md` and of the book (`docs/src/`, in its
//! `SUMMARY.md` order) is marked, on the line above it, `<!-- readme: run -->`
//! (this test runs it) or `<!-- readme: skip — why -->`. The runnable ones
//! run with bash, in order, in a fresh copy of the repository's tracked files
//! (no `target/`, `node_modules/`, `gen/` or venv left from an earlier run),
//! so the test fails as soon as the documentation and reality diverge. Every
//! relative link in them must lead to a file that exists, and every `#anchor`
//! to a heading of it.
//!
//! One substitution: `cargo run -p idem -- ARGS` runs the `idem` this test
//! was built with (`CARGO_BIN_EXE_idem`, the same sources), after creating
//! `target/` as cargo does in a fresh clone. Building the copy for real
//! would rebuild `idem` (minutes) and overwrite the binary that other tests
//! are running. Every other command runs as written.

use std::path::{Path, PathBuf};
use std::process::Command;

const MARK_RUN: &str = "<!-- readme: run -->";
const MARK_SKIP: &str = "<!-- readme: skip — ";
/// The front door stays a front door.
const README_MAX_LINES: usize = 300;

/// The README, then the book's chapters in reading order: (path from the
/// repository's root, text).
fn documents() -> Vec<(String, String)> {
    let read = |path: &str| {
        std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let summary = read("docs/src/SUMMARY.md");
    let mut docs = vec![("README.md".to_owned(), read("README.md"))];
    for line in summary.lines() {
        if let Some(target) = links(line).into_iter().next() {
            let path = format!("docs/src/{target}");
            let text = read(&path);
            docs.push((path, text));
        }
    }
    assert!(docs.len() > 8, "the book's chapters were not found");
    docs
}

/// One fenced shell block: its first line's number, its marker and its text.
struct Block {
    line: usize,
    marker: String,
    script: String,
}

fn shell_blocks(readme: &str) -> Vec<Block> {
    let lines: Vec<&str> = readme.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let fence = lines[i].trim_start();
        if fence.starts_with("```") && fence.len() > 3 {
            let shell = matches!(&fence[3..], "sh" | "bash" | "shell" | "console");
            let start = i;
            i += 1;
            let mut body = Vec::new();
            while i < lines.len() && !lines[i].trim_start().starts_with("```") {
                body.push(lines[i]);
                i += 1;
            }
            if shell {
                blocks.push(Block {
                    line: start + 1,
                    marker: start
                        .checked_sub(1)
                        .map(|m| lines[m].trim().to_owned())
                        .unwrap_or_default(),
                    script: body.join("\n") + "\n",
                });
            }
        }
        i += 1;
    }
    blocks
}

#[test]
fn every_shell_block_in_the_readme_and_the_book_is_run_or_says_why_not() {
    let mut run = 0;
    for (path, text) in documents() {
        for block in shell_blocks(&text) {
            let ok = block.marker == MARK_RUN
                || (block.marker.starts_with(MARK_SKIP)
                    && block.marker.ends_with("-->")
                    && block.marker.len() > MARK_SKIP.len() + 10);
            assert!(
                ok,
                "{path} line {}: a shell block needs `{MARK_RUN}` or `{MARK_SKIP}<why> -->` on the line above, found {:?}",
                block.line, block.marker
            );
            run += usize::from(block.marker == MARK_RUN);
        }
    }
    assert!(run >= 3, "the JavaScript and Python quick starts run");
}

#[test]
fn the_readme_is_a_front_door() {
    let (_, readme) = &documents()[0];
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; at most {README_MAX_LINES} (the rest belongs in the book, docs/src/)"
    );
}

/// The targets of the Markdown links on `line`: `[text](target)`, without
/// a title.
fn links(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        found.push(target.to_owned());
        rest = &after[end..];
    }
    found
}

/// A heading's anchor as GitHub and mdBook make it: lower case, spaces to
/// `-`, anything but letters, digits, `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of the headings of a Markdown text (outside code blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
            }
            !fenced && line.starts_with('#')
        })
        .map(|line| anchor(line.trim_start_matches('#')))
        .collect()
}

#[test]
fn every_link_in_the_readme_and_the_book_leads_somewhere() {
    let mut broken = Vec::new();
    for (path, text) in documents() {
        let dir = Path::new(&path).parent().unwrap_or(Path::new(""));
        let mut fenced = false;
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
            }
            if fenced {
                continue;
            }
            for target in links(line) {
                if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                    continue;
                }
                let (file, fragment) = target.split_once('#').unwrap_or((&target, ""));
                let file = if file.is_empty() {
                    root().join(&path)
                } else {
                    root().join(dir).join(file)
                };
                if !file.exists() {
                    broken.push(format!("{path}:{}: {target}: no such file", n + 1));
                    continue;
                }
                if !fragment.is_empty() {
                    let text = std::fs::read_to_string(&file).unwrap_or_default();
                    if !anchors(&text).iter().any(|a| a == fragment) {
                        broken.push(format!("{path}:{}: {target}: no such heading", n + 1));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The repository's root, from this test's manifest directory.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// The tracked files (as they are in the work tree) copied into `to`: what
/// a fresh clone of this commit plus its uncommitted edits holds.
fn fresh_copy(to: &Path) {
    let out = Command::new("git")
        .args(["ls-files", "-z", "--cached"])
        .current_dir(root())
        .output()
        .expect("git ls-files");
    assert!(out.status.success(), "git ls-files failed");
    for name in out.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = std::str::from_utf8(name).unwrap();
        let from = root().join(name);
        if !from.is_file() {
            continue; // deleted in the work tree
        }
        let dest = to.join(name);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&from, &dest).unwrap();
    }
}

/// A `cargo` first on the PATH that runs `cargo run -p idem -- ARGS` with
/// the built `idem`, and hands anything else to the real cargo.
fn cargo_shim(dir: &Path) -> PathBuf {
    let bin = dir.join("shim-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let real = String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v cargo"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let script = format!(
        "#!/bin/sh\n\
         if [ \"$1 $2 $3 $4\" = \"run -p idem --\" ]; then\n\
           shift 4; mkdir -p target; exec '{}' \"$@\"\n\
         fi\n\
         exec '{}' \"$@\"\n",
        env!("CARGO_BIN_EXE_idem"),
        real.trim()
    );
    let shim = bin.join("cargo");
    std::fs::write(&shim, script).unwrap();
    let mut perms = std::fs::metadata(&shim).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&shim, perms).unwrap();
    bin
}

#[test]
fn the_readme_blocks_marked_run_run_as_written_on_a_fresh_copy() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("idem");
    fresh_copy(&copy);
    let search_path = format!(
        "{}:{}",
        cargo_shim(dir.path()).display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let blocks = documents().into_iter().flat_map(|(path, text)| {
        shell_blocks(&text)
            .into_iter()
            .filter(|b| b.marker == MARK_RUN)
            .map(move |b| (path.clone(), b))
    });
    for (path, block) in blocks {
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", &block.script])
            .current_dir(&copy)
            .env("PATH", &search_path)
            .env_remove("IDEM_COMPONENT")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{path} line {} failed ({}):\n{}\n--- stdout\n{}\n--- stderr\n{}",
            block.line,
            out.status,
            block.script,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_book_states_the_gateways_key_limit_and_why_it_is_below_the_guards() {
    let gateway = idem::server::parse::MAX_KEY_BYTES;
    let book: String = documents().into_iter().map(|(_, text)| text).collect();
    assert!(
        book.contains(&format!("takes 1 to {gateway} bytes of visible ASCII")),
        "the book must state the gateway's key limit, {gateway} bytes"
    );
    assert!(book.contains("keys are 1–255 bytes"), "and the guard's own");
    // The longest scope (16 hex digits and a `/`) plus the longest key fits the guard.
    assert!(16 + 1 + gateway <= 255);
}
