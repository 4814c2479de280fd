//! `kiln query --url U --db DB "from users where ..."`: runs a query on a server
//! and prints the results as a table (the fields of the documents, by column) or,
//! with `--json`, the server's answer as it is.

use crate::client::{path_escape, Endpoint, TlsArgs};
use serde_json::{json, Map, Value};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct QueryArgs {
    /// The server, e.g. http://127.0.0.1:8080 or https://kiln.example:8443.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// The database to query.
    #[arg(long)]
    db: String,
    /// Parameters as a JSON object, e.g. '{"min": 21}'.
    #[arg(long)]
    params: Option<String>,
    /// Wait up to this long for the index to catch up.
    #[arg(long, default_value_t = 0)]
    wait_ms: u64,
    /// API key for a server running with --auth.
    #[arg(long, env = "KILN_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    #[command(flatten)]
    tls: TlsArgs,
    /// Print the server's JSON answer.
    #[arg(long)]
    json: bool,
    /// The next page: the `continuation` of the page before (the same query; a
    /// table says it under the rows when there are more).
    #[arg(long)]
    continuation: Option<String>,
    /// The query.
    query: String,
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

pub fn run(args: QueryArgs) -> AnyResult<ExitCode> {
    let endpoint = Endpoint::parse(&args.url, args.api_key.clone(), &args.tls)?;
    let params: Map<String, Value> = match &args.params {
        Some(p) => {
            serde_json::from_str(p).map_err(|e| crate::UsageError(format!("--params: {e}")))?
        }
        None => Map::new(),
    };
    let mut body =
        json!({"query": args.query, "params": params, "wait_for_non_stale_ms": args.wait_ms});
    if let Some(token) = &args.continuation {
        body["continuation"] = json!(token);
    }
    let body = body.to_string();
    let path = format!("/dbs/{}/queries", path_escape(&args.db));
    let (status, answer) = endpoint.request_any("POST", &path, body.as_bytes())?;
    if status != 200 {
        // Printed and given its exit code as every command's server error.
        return Err(crate::client::ClientError::Status {
            status,
            body: String::from_utf8_lossy(&answer).into_owned(),
        }
        .into());
    }
    let v: Value = serde_json::from_slice(&answer)
        .map_err(|e| format!("the server answered {status} with non-JSON: {e}"))?;
    if args.json {
        println!("{v}");
        return Ok(ExitCode::SUCCESS);
    }
    print_table(&v);
    Ok(ExitCode::SUCCESS)
}

fn cell(v: &Value) -> String {
    let s = match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    if s.chars().count() > 40 {
        let cut: String = s.chars().take(39).collect();
        format!("{cut}…")
    } else {
        s
    }
}

/// The table's columns: `@id`, then every field of the results in the order
/// first seen.
fn columns_of(results: &[Value]) -> Vec<String> {
    let mut columns = vec!["@id".to_string()];
    for r in results {
        if let Some(o) = r.as_object() {
            for k in o.keys() {
                if k != "@metadata" && !columns.contains(k) {
                    columns.push(k.clone());
                }
            }
        }
    }
    columns
}

fn print_table(v: &Value) {
    let results = v["results"].as_array().cloned().unwrap_or_default();
    let columns = columns_of(&results);
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            columns
                .iter()
                .map(|c| {
                    if c == "@id" {
                        cell(&r["@metadata"]["@id"])
                    } else {
                        cell(r.get(c).unwrap_or(&Value::Null))
                    }
                })
                .collect()
        })
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([c.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    println!("{}", line(&columns));
    for r in &rows {
        println!("{}", line(r));
    }
    println!(
        "-- {} of {} (skipped {}), index {}, {}{} in {} ms",
        rows.len(),
        v["total"],
        v["skipped"],
        v["index"].as_str().unwrap_or("none (collection scan)"),
        if v["stale"] == true {
            "STALE"
        } else {
            "not stale"
        },
        v["auto_index_created"]
            .as_str()
            .map_or(String::new(), |a| format!(", created auto index {a}")),
        v["duration_ms"]
    );
    // On stderr, as `kiln list`'s `--start-after`: the rows stay the table alone.
    if let Some(token) = v["continuation"].as_str() {
        eprintln!("more: the same query with --continuation {token}");
    }
}
