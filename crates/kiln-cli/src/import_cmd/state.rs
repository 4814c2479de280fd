//! The resume state file: how many documents of each input the server acknowledged.

use super::{ImportArgs, ImportError};
use std::path::{Path, PathBuf};

#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct State {
    pub(super) version: u32,
    pub(super) db: String,
    pub(super) run: String,
    pub(super) inputs: Vec<StateInput>,
}

#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct StateInput {
    pub(super) path: String,
    pub(super) acked: u64,
}

pub(super) fn state_path(args: &ImportArgs) -> Option<PathBuf> {
    if let Some(p) = &args.state {
        return Some(p.clone());
    }
    let first = args.inputs.first()?;
    if first.as_os_str() == "-" {
        return None;
    }
    let s = first.to_string_lossy();
    let s = s.trim_end_matches('/');
    Some(PathBuf::from(format!("{s}.kiln-import-state")))
}

pub(super) fn input_key(p: &Path) -> String {
    std::fs::canonicalize(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}

pub(super) fn save_state(path: &Path, state: &State) -> Result<(), ImportError> {
    let tmp = path.with_extension("kiln-import-state.tmp");
    let text = serde_json::to_vec_pretty(state).map_err(|e| ImportError::State(e.to_string()))?;
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| ImportError::State(format!("writing {}: {e}", path.display())))
}

pub(super) fn load_state(path: &Path, args: &ImportArgs) -> Result<State, ImportError> {
    let text = std::fs::read(path).map_err(|e| {
        ImportError::State(format!(
            "{}: {e} (nothing to resume; run without --resume)",
            path.display()
        ))
    })?;
    let st: State = serde_json::from_slice(&text)
        .map_err(|e| ImportError::State(format!("{}: unreadable: {e}", path.display())))?;
    let keys: Vec<String> = args.inputs.iter().map(|p| input_key(p)).collect();
    let theirs: Vec<&str> = st.inputs.iter().map(|i| i.path.as_str()).collect();
    if st.db != args.db || keys.iter().map(String::as_str).ne(theirs.iter().copied()) {
        return Err(ImportError::State(format!(
            "{} is for database {:?} and inputs {:?}, not this import",
            path.display(),
            st.db,
            theirs
        )));
    }
    Ok(st)
}
