//! The README and `docs/` hold together: every relative link points at a
//! file that exists (and, with a `#fragment`, at a heading in it), every
//! document is reachable from the README, and the README stays short enough
//! to read in one sitting.
//!
//! What the documents show is tested where it is used: the policy commands
//! in `policy_cli.rs`, the guide's suite in `policy_bundled.rs`, the flags
//! table in `run_options.rs`, the demo in `tests/stack/tests/demo.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The longest the README may grow: what it is, the two commands, what the
/// demo shows, links. The rest belongs in `docs/`.
const README_MAX_LINES: usize = 250;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The README and every Markdown file under `docs/`.
fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<_> = fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    let mut all = vec![root().join("README.md")];
    all.extend(docs);
    all
}

/// The lines of `text` outside fenced code blocks, with inline code spans
/// blanked, so an example that looks like a link is not taken for one.
fn prose(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut out = String::new();
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
                out.push(c);
            } else if in_code {
                out.push(' ');
            } else {
                out.push(c);
            }
        }
        lines.push(out);
    }
    lines
}

/// The targets of the inline links `[text](target)` in `text`.
fn links(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose(text) {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else {
                break;
            };
            targets.push(after[..end].trim().to_owned());
            rest = &after[end..];
        }
    }
    targets
}

/// A heading's anchor as GitHub makes it: lower case, punctuation dropped
/// (but `-` and `_`), spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of `text`'s headings; a repeated heading gets `-1`, `-2`...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        if fenced {
            continue;
        }
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(heading);
        let count = seen.entry(base.clone()).or_insert(0);
        let anchor = match *count {
            0 => base,
            n => format!("{base}-{n}"),
        };
        anchors.insert(anchor);
        *count += 1;
    }
    anchors
}

fn is_external(target: &str) -> bool {
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|scheme| target.starts_with(scheme))
}

#[test]
fn every_relative_link_points_at_a_file_and_heading_that_exist() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for document in documents() {
        let text = fs::read_to_string(&document).unwrap();
        let dir = document.parent().unwrap();
        for target in links(&text) {
            if is_external(&target) {
                continue;
            }
            checked += 1;
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                document.clone()
            } else {
                dir.join(path)
            };
            let shown = document.strip_prefix(root()).unwrap().display();
            if !file.exists() {
                broken.push(format!("{shown}: ({target}): no such file"));
                continue;
            }
            if let Some(fragment) = fragment
                && file.extension().is_some_and(|ext| ext == "md")
                && !anchors(&fs::read_to_string(&file).unwrap()).contains(fragment)
            {
                broken.push(format!("{shown}: ({target}): no such heading"));
            }
        }
    }
    assert!(checked > 20, "only {checked} relative links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_document_is_linked_from_the_readme() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let linked: BTreeSet<PathBuf> = links(&readme)
        .iter()
        .filter(|target| !is_external(target))
        .map(|target| root().join(target.split('#').next().unwrap()))
        .collect();
    for document in documents().into_iter().skip(1) {
        assert!(
            linked.contains(&document),
            "the README does not link {}",
            document.display()
        );
    }
}

#[test]
fn the_readme_stays_short() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "the README has {lines} lines, more than {README_MAX_LINES}: move detail to docs/"
    );
}

#[test]
fn the_link_reader_sees_links_and_anchors_as_github_does() {
    let text = "# `arcwright run`'s flags\n\
                See [a](docs/a.md#x-y), `[not](a link)`.\n\
                ```\n[not](either)\n# not a heading\n```\n\
                ## Reading a scale set's state\n## Notes\n## Notes\n";
    assert_eq!(links(text), ["docs/a.md#x-y"]);
    assert_eq!(
        anchors(text),
        BTreeSet::from([
            "arcwright-runs-flags".to_owned(),
            "reading-a-scale-sets-state".to_owned(),
            "notes".to_owned(),
            "notes-1".to_owned(),
        ])
    );
}
