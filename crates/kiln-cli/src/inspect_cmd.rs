//! `kiln check` and `kiln stats`: what the engine says of a database, offline.
//! Both take a data directory (every database in it, by name) or one database's
//! (or one raw environment's) directory.

use crate::storage_args::EncryptionArgs;
use crate::AnyResult;
use kiln_storage::{Env, Options};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `(name, directory)` of every database `dir` names: the databases of a data
/// directory, or `dir` itself when it is one environment.
fn environments(dir: &Path) -> AnyResult<Vec<(String, PathBuf)>> {
    if let Some(databases) = crate::docs_cmd::database_dirs(dir)? {
        if databases.is_empty() {
            eprintln!("{} holds no database yet", dir.display());
        }
        return Ok(databases.into_iter().map(|d| (name_of(&d), d)).collect());
    }
    if !dir.join(kiln_storage::DATA_FILE).exists() {
        return Err(format!(
            "{} is neither a data directory (no databases/) nor a database (no {})",
            dir.display(),
            kiln_storage::DATA_FILE
        )
        .into());
    }
    Ok(vec![(name_of(dir), dir.to_path_buf())])
}

fn name_of(dir: &Path) -> String {
    dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Checks every database; exit code 1 if any has a problem.
pub fn check(dir: &Path, json: bool, encryption: &EncryptionArgs) -> AnyResult<ExitCode> {
    let options = encryption.storage_options()?;
    let mut clean = true;
    for (name, env_dir) in environments(dir)? {
        clean &= check_one(&name, &env_dir, json, &options)?;
    }
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Checks one environment and prints the report; false if it found problems.
fn check_one(name: &str, dir: &Path, json: bool, options: &Options) -> AnyResult<bool> {
    let env = Env::open(dir, options.clone())?;
    let report = env.check()?;
    let attachments = check_attachments(dir, &env)?;
    let attachments_clean = attachments.as_ref().is_none_or(|a| a.is_ok());
    if json {
        let problems: Vec<_> = report
            .problems
            .iter()
            .map(|p| serde_json::json!({"file": p.file, "page": p.page, "what": p.what}))
            .collect();
        let mut v = serde_json::json!({"database": name, "path": dir, "clean": report.is_clean(), "txn_id": report.txn_id, "trees": report.trees, "entries": report.entries, "pages_total": report.pages_total, "pages_reachable": report.pages_reachable, "pages_free": report.pages_free, "problems": problems});
        v["page_size"] = kiln_storage::PAGE_SIZE.into();
        v["tree_space"] = tree_space(&env, &report)?;
        if let Some(a) = &attachments {
            v["attachments"] = attachments_json(a);
            v["clean"] = (report.is_clean() && attachments_clean).into();
        }
        println!("{v}");
    } else {
        println!("database {name}:");
        println!(
            "checked txn {}: {} trees, {} entries, {} pages ({} reachable, {} free)",
            report.txn_id,
            report.trees,
            report.entries,
            report.pages_total,
            report.pages_reachable,
            report.pages_free
        );
        for p in &report.problems {
            println!("PROBLEM {p}");
        }
        println!(
            "{}",
            if report.is_clean() {
                "ok: no problems found"
            } else {
                "FAILED"
            }
        );
    }
    if let (false, Some(a)) = (json, &attachments) {
        print_attachments(a);
    }
    Ok(report.is_clean() && attachments_clean)
}

/// A database's attachments (`kiln_docs::check_attachments_at`: every blob
/// re-hashed, files nothing names, reference counts against the documents);
/// `None` when the directory holds none.
fn check_attachments(dir: &Path, env: &Env) -> AnyResult<Option<kiln_docs::AttachmentCheck>> {
    if !dir.join("attachments").exists() {
        return Ok(None);
    }
    Ok(Some(kiln_docs::check_attachments_at(env, dir)?))
}

fn attachments_json(a: &kiln_docs::AttachmentCheck) -> serde_json::Value {
    let miscounted: Vec<_> = a
        .miscounted
        .iter()
        .map(|(h, counted, named)| serde_json::json!({"hash": h, "counted": counted, "named": named}))
        .collect();
    serde_json::json!({"clean": a.is_ok(), "blobs": a.blobs, "bytes": a.bytes, "missing": a.missing, "corrupt": a.corrupt, "unreferenced": a.unreferenced, "miscounted": miscounted})
}

fn print_attachments(a: &kiln_docs::AttachmentCheck) {
    println!(
        "attachments: {} blobs, {} bytes re-hashed",
        a.blobs, a.bytes
    );
    for h in &a.missing {
        println!("PROBLEM attachment blob {h} is missing");
    }
    for h in &a.corrupt {
        println!("PROBLEM attachment blob {h} does not hash to its name (or has the wrong size)");
    }
    for p in &a.unreferenced {
        println!("PROBLEM {p} is named by no reference (removed at the next open)");
    }
    for (h, counted, named) in &a.miscounted {
        println!(
            "PROBLEM attachment {h}: counted {counted} references, documents name it {named} times"
        );
    }
    println!(
        "{}",
        if a.is_ok() {
            "ok: attachments intact"
        } else {
            "FAILED"
        }
    );
}

/// Per tree: its entries' key and value bytes (read through a cursor, values as
/// stored: whole, wherever they live) beside the pages the check counted for it
/// and its leaves' fill. What the space breakdown of docs/benchmarks.md is made of.
fn tree_space(
    env: &Env,
    report: &kiln_storage::check::CheckReport,
) -> AnyResult<serde_json::Value> {
    let r = env.begin_read()?;
    let mut out = serde_json::Map::new();
    for (name, pages) in &report.tree_pages {
        let (mut key_bytes, mut value_bytes) = (0u64, 0u64);
        if name != "<catalog>" {
            let mut c = r.cursor(name)?;
            let mut e = c.first()?;
            while let Some((k, v)) = e {
                key_bytes += k.len() as u64;
                value_bytes += v.len() as u64;
                e = c.next()?;
            }
        }
        let leaf_capacity = pages.leaf_pages * kiln_storage::PAGE_SIZE as u64;
        out.insert(
            name.clone(),
            serde_json::json!({
                "key_bytes": key_bytes, "value_bytes": value_bytes,
                "leaf_pages": pages.leaf_pages, "branch_pages": pages.branch_pages,
                "value_pages": pages.value_pages, "leaf_entry_bytes": pages.leaf_entry_bytes,
                "leaf_fill": if leaf_capacity == 0 { 0.0 } else { pages.leaf_entry_bytes as f64 / leaf_capacity as f64 },
            }),
        );
    }
    Ok(serde_json::Value::Object(out))
}

/// Prints every database's figures.
pub fn stats(dir: &Path, json: bool, encryption: &EncryptionArgs) -> AnyResult<ExitCode> {
    let options = encryption.storage_options()?;
    for (name, env_dir) in environments(dir)? {
        let env = Env::open(&env_dir, options.clone())?;
        print_stats(&name, &env.stats(), json);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_stats(database: &str, s: &kiln_storage::Stats, json: bool) {
    let lat = |l: &kiln_storage::LatencySummary| serde_json::json!({"count": l.count, "mean_us": l.mean_us, "p50_us": l.p50_us, "p99_us": l.p99_us, "max_us": l.max_us});
    let mut v = serde_json::json!({
        "database": database,
        "last_txn_id": s.last_txn_id, "synced_txn_id": s.synced_txn_id,
        "commits": s.commits, "aborts": s.aborts,
        "journal_writes": s.journal_writes, "journal_bytes": s.journal_bytes,
        "journal_write_latency": lat(&s.journal_write_latency),
        "journal_files": s.journal_files, "journal_files_created": s.journal_files_created, "journal_files_recycled": s.journal_files_recycled,
        "journal_switch_waits": s.journal_switch_waits,
        "write_buffer_bytes": s.write_buffer_bytes, "write_buffer_freezes": s.write_buffer_freezes, "write_buffer_merges": s.write_buffer_merges, "write_buffer_keys_merged_ahead": s.write_buffer_keys_merged_ahead,
        "journal_direct_io_fallback": s.journal_direct_io_fallback, "journal_direct_io": s.journal_direct_io,
        "data_syncs": s.data_syncs, "data_sync_latency": lat(&s.data_sync_latency),
        "buffered_journal_sync_latency": lat(&s.buffered_journal_sync_latency),
        "pages_written_back": s.pages_written_back, "checkpoints": s.checkpoints,
        "records_replayed_on_open": s.records_replayed_on_open,
        "pages_total": s.pages_total, "pages_in_use": s.pages_in_use, "pages_free": s.pages_free, "pages_pending_free": s.pages_pending_free,
        "pages_unflushed": s.pages_unflushed, "readers_open": s.readers_open, "data_file_bytes": s.data_file_bytes,
        "journal_body_bytes_full_images": s.journal_body_bytes_full_images,
        "journal_body_bytes_with_diffs": s.journal_body_bytes_raw,
        "journal_body_bytes_stored": s.journal_body_bytes_stored,
        "commit_queue": {
            "units_committed": s.commit_queue.units_committed, "units_failed": s.commit_queue.units_failed,
            "groups": s.commit_queue.groups, "avg_group_units": s.commit_queue.avg_group_units(),
            "max_group_units": s.commit_queue.max_group_units, "overloaded_rejections": s.commit_queue.overloaded_rejections,
        },
    });
    // (Beside the literal above, which is at the macro's recursion limit.)
    v["journal_files_cut_short"] = s.journal_files_cut_short.into();
    v["journal_referenced_value_bytes"] = s.journal_referenced_value_bytes.into();
    v["batches_read_ahead"] = s.batches_read_ahead.into();
    if json {
        println!("{v}");
        return;
    }
    println!("database {database}:");
    if let serde_json::Value::Object(m) = v {
        for (k, val) in m.into_iter().filter(|(k, _)| k != "database") {
            println!("{k:<28} {val}");
        }
    }
}

/// Fails unless `dir` holds a storage environment.
pub fn require_env(dir: &Path) -> AnyResult<()> {
    if !dir.join(kiln_storage::DATA_FILE).exists() {
        return Err(format!(
            "{} holds no Kiln environment (no {})",
            dir.display(),
            kiln_storage::DATA_FILE
        )
        .into());
    }
    Ok(())
}
