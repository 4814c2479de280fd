//! Every subcommand's `--help`, found by walking the `Commands:` listings from
//! `kiln --help` down (so a nested one such as `kiln subscriptions get` is
//! reached): each subcommand, argument and option has a description. An option
//! with no doc comment shows only its name (and perhaps `[default: ...]`), which
//! tells a user nothing (issue 55: `--db`, `<ID>`, `<NAME>`, `--out`,
//! `--content-type` of revisions, subscriptions and attachments).
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::process::Command;

const KILN: &str = env!("CARGO_BIN_EXE_kiln");

/// `kiln <path> --help`'s text.
fn help(path: &[String]) -> String {
    let out = Command::new(KILN)
        .args(path)
        .arg("--help")
        .env_remove("KILN_API_KEY")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kiln {} --help: {}",
        path.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// One entry of a help section: its name and whether a description goes with it.
#[derive(Debug)]
struct Entry {
    section: String,
    term: String,
    described: bool,
}

/// The entries of the `Commands:`, `Arguments:` and `Options:` sections (and of
/// any other `Title:` section clap prints, e.g. a `next_help_heading`).
fn entries(text: &str) -> Vec<Entry> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut section: Option<String> = None;
    for (i, line) in lines.iter().enumerate() {
        if !line.starts_with(' ') && line.trim_end().ends_with(':') && !line.contains(' ') {
            section = Some(line.trim_end().trim_end_matches(':').to_string());
            continue;
        }
        if line.trim().is_empty() || !line.starts_with(' ') {
            if !line.trim().is_empty() {
                section = None; // prose (`Usage: ...`, the about text)
            }
            continue;
        }
        let Some(section) = &section else {
            continue;
        };
        let indent = line.len() - line.trim_start().len();
        // Entries are indented by at most 6 (`  -q, --quiet`, `      --url <URL>`);
        // a description on lines of its own goes deeper (clap's next-line form).
        if indent > 6 {
            continue;
        }
        let body = line.trim_start();
        let (term, rest) = match body.find("  ") {
            Some(at) => (&body[..at], body[at..].trim()),
            None => (body.trim_end(), ""),
        };
        // A subcommand's name, an argument (`<ID>`, `[FILE]...`) or an option
        // (`-q, --quiet`, `--url <URL>`); anything else is prose (an `after_help`
        // with headings of its own).
        let is_entry = if section == "Commands" {
            term.split(", ").all(is_name)
        } else {
            is_argument(term) || is_option(term)
        };
        if !is_entry {
            if ["Commands", "Arguments", "Options"].contains(&section.as_str()) {
                // clap's own sections hold entries only: one this test cannot
                // read is reported, not skipped.
                out.push(Entry {
                    section: section.clone(),
                    term: format!("(unreadable) {body}"),
                    described: false,
                });
            }
            continue;
        }
        let described_here = !rest.is_empty() && !rest.starts_with('[');
        let described_below = lines.get(i + 1).is_some_and(|next| {
            let next_indent = next.len() - next.trim_start().len();
            !next.trim().is_empty() && next_indent > indent + 2 && !next.trim().starts_with('[')
        });
        out.push(Entry {
            section: section.clone(),
            term: term.to_string(),
            described: described_here || (rest.is_empty() && described_below),
        });
    }
    out
}

/// A subcommand's name: `chain-stop`.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// A value's name: `<URL>`, `[FILE]`, `<FILES>...`.
fn is_value(s: &str) -> bool {
    let s = s.strip_suffix("...").unwrap_or(s);
    let inner = s
        .strip_prefix('<')
        .and_then(|x| x.strip_suffix('>'))
        .or_else(|| s.strip_prefix('[').and_then(|x| x.strip_suffix(']')));
    let inner = inner.map(|x| {
        x.strip_prefix('<')
            .and_then(|y| y.strip_suffix('>'))
            .unwrap_or(x)
    });
    inner.is_some_and(|x| {
        !x.is_empty()
            && x.chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_' || c == '-')
    })
}

/// A positional argument's entry: `<ID>`, `[FILE]`, `<FILES>...`.
fn is_argument(term: &str) -> bool {
    is_value(term)
}

/// An option's entry: `-q, --quiet`, `--url <URL>`, `-h, --help`.
fn is_option(term: &str) -> bool {
    let mut words = term.split(' ');
    let Some(flags) = words.next() else {
        return false;
    };
    let flag_ok = |f: &str| {
        f.strip_prefix("--").map_or_else(
            || {
                f.strip_prefix('-')
                    .is_some_and(|c| c.len() == 1 && c.chars().all(|c| c.is_ascii_alphanumeric()))
            },
            is_name,
        )
    };
    let mut flags = vec![flags.trim_end_matches(',')];
    let mut rest: Vec<&str> = words.collect();
    // `-q, --quiet`: the short flag, then the long one.
    if term.contains(", ") && !rest.is_empty() {
        flags.push(rest.remove(0));
    }
    flags.into_iter().all(flag_ok) && rest.iter().all(|v| is_value(v))
}

/// The subcommands a help text lists (`help` left out: clap's own).
fn subcommands(text: &str) -> Vec<String> {
    entries(text)
        .into_iter()
        .filter(|e| e.section == "Commands" && e.term != "help")
        .map(|e| e.term.split(',').next().unwrap().trim().to_string())
        .collect()
}

#[test]
fn every_subcommand_argument_and_option_has_a_description() {
    let mut missing = Vec::new();
    let mut visited = Vec::new();
    let mut todo: Vec<Vec<String>> = vec![vec![]];
    while let Some(path) = todo.pop() {
        let text = help(&path);
        for e in entries(&text) {
            if !e.described {
                missing.push(format!(
                    "kiln {} --help: {} `{}` has no description",
                    path.join(" "),
                    e.section,
                    e.term
                ));
            }
        }
        for sub in subcommands(&text) {
            let mut p = path.clone();
            p.push(sub);
            todo.push(p);
        }
        visited.push(path.join(" "));
    }
    // The walk reached the nested subcommands the issue named.
    for nested in [
        "subscriptions get",
        "subscriptions create",
        "revisions list",
        "attachments put",
        "attachments get",
        "backup verify",
        "cluster status",
    ] {
        assert!(
            visited.iter().any(|v| v == nested),
            "`kiln {nested}` not reached from `kiln --help`: {visited:?}"
        );
    }
    assert!(
        missing.is_empty(),
        "{} help entries without a description:\n{}",
        missing.len(),
        missing.join("\n")
    );
}

/// The parser of help texts itself: an entry with only a default, or none at all,
/// is undescribed; a description on the same line or on the next lines is one.
#[test]
fn the_help_parser_tells_described_entries() {
    let text = [
        "About",
        "",
        "Usage: kiln x [OPTIONS] <ID>",
        "",
        "Arguments:",
        "  <ID>    ",
        "  <NAME>  The name",
        "",
        "Options:",
        "      --db <DB>        ",
        "      --out <OUT>  [default: x]",
        "  -q, --quiet      No bar",
        "      --long <L>",
        "          Said below",
        "",
        "          More",
        "      --bare",
        "  -h, --help  Print help",
        "",
        "Inputs:",
        "  NDJSON: prose after the options, not an entry",
        "  - nor a bullet,",
        "  <first input>.state) nor prose that starts like an argument",
        "  --resume skips those: nor prose that starts like an option",
    ]
    .join("\n");
    let text = text.as_str();
    let got: Vec<(String, bool)> = entries(text)
        .into_iter()
        .map(|e| (e.term, e.described))
        .collect();
    let want: Vec<(String, bool)> = [
        ("<ID>", false),
        ("<NAME>", true),
        ("--db <DB>", false),
        ("--out <OUT>", false),
        ("-q, --quiet", true),
        ("--long <L>", true),
        ("--bare", false),
        ("-h, --help", true),
    ]
    .iter()
    .map(|(t, d)| (t.to_string(), *d))
    .collect();
    assert_eq!(got, want);
}

/// Issue 55: `kiln restore` said "(offline) data directory" though it also
/// restores into a running server (`--url`); `kiln subscriptions` did not say it
/// can print one subscription (`get`).
#[test]
fn restore_and_subscriptions_say_all_they_do() {
    let top = help(&[]);
    let line = |name: &str| {
        top.lines()
            .find(|l| l.trim_start().starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in kiln --help:\n{top}"))
            .to_string()
    };
    let restore = line("restore");
    assert!(
        restore.contains("--url")
            && restore.contains("--data-dir")
            && !restore.contains("offline)"),
        "{restore}"
    );
    let about = help(&["restore".to_string()]);
    assert!(about.lines().next().unwrap().contains("--url"), "{about}");
    assert!(line("subscriptions").contains("`get`"), "{top}");
}
