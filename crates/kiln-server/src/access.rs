//! Who may do what: the clearance an API key or a client certificate carries, and
//! the permission each route needs (declared with the route: `route_table.rs`).
//!
//! A clearance is either `operator` (everything: every database, the server's
//! statistics and metrics, the cluster) or a list of grants, each a database name
//! or a prefix pattern (`shop-*`, `*`) with an access level. Levels are ordered:
//! `admin` includes `read_write`, which includes `read`. A database matched by
//! several grants gets the highest of them.

use kiln_docs::validate_database_name;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A key's access to the databases a grant names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DbAccess {
    /// Documents, attachments, queries, indexes' states, the changes feed,
    /// subscriptions' states and consuming them, revisions listed.
    Read,
    /// Read, and write documents and attachments (one at a time, in batches, in
    /// bulk), revert to a revision.
    ReadWrite,
    /// Read and write, and the database itself: create and delete it, define and
    /// reset indexes, backups and restores, revisions' configuration and purges,
    /// create and delete subscriptions, purge tombstones.
    Admin,
}

impl DbAccess {
    pub fn as_str(self) -> &'static str {
        match self {
            DbAccess::Read => "read",
            DbAccess::ReadWrite => "read_write",
            DbAccess::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Option<DbAccess> {
        match text {
            "read" => Some(DbAccess::Read),
            "read_write" => Some(DbAccess::ReadWrite),
            "admin" => Some(DbAccess::Admin),
            _ => None,
        }
    }
}

/// Access to the databases a name or pattern matches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DbGrant {
    /// A database name, or a prefix followed by `*` (`shop-*`; `*` alone: all).
    pub database: String,
    pub access: DbAccess,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GrantError {
    #[error("{0:?} is not DATABASE:ACCESS (ACCESS one of read, read_write, admin)")]
    Shape(String),
    #[error("{pattern:?} is not a database name or a prefix followed by '*': {why}")]
    Pattern { pattern: String, why: String },
}

impl DbGrant {
    /// `shop:read_write`, `reports-*:read`, `*:admin`.
    pub fn parse(text: &str) -> Result<DbGrant, GrantError> {
        let shape = || GrantError::Shape(text.to_string());
        let (database, access) = text.rsplit_once(':').ok_or_else(shape)?;
        let access = DbAccess::parse(access).ok_or_else(shape)?;
        validate_pattern(database)?;
        Ok(DbGrant {
            database: database.to_string(),
            access,
        })
    }

    fn matches(&self, db: &str) -> bool {
        match self.database.strip_suffix('*') {
            Some(prefix) => db.starts_with(prefix),
            None => self.database == db,
        }
    }
}

/// A name, or a prefix of one followed by `*` (the prefix may be empty).
fn validate_pattern(pattern: &str) -> Result<(), GrantError> {
    let bad = |why: String| GrantError::Pattern {
        pattern: pattern.to_string(),
        why,
    };
    match pattern.strip_suffix('*') {
        Some("") => Ok(()),
        // A prefix need not be a whole name ("shop-" ends with '-', which a name
        // may hold anywhere but its first character): check it as the start of one.
        Some(prefix) => validate_database_name(&format!("{prefix}x"))
            .map_err(|e| bad(e.to_string()))
            .and_then(|()| {
                if prefix.contains('*') {
                    Err(bad("'*' may only end a pattern".into()))
                } else {
                    Ok(())
                }
            }),
        None => validate_database_name(pattern).map_err(|e| bad(e.to_string())),
    }
}

/// What a key or a certificate may do. Keys created before permissions existed
/// have no clearance in the key file: they keep opening everything (operator).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Clearance {
    #[default]
    Operator,
    Databases(Vec<DbGrant>),
}

impl Clearance {
    /// The highest access any grant gives to `db` (an operator: admin).
    pub fn access_to(&self, db: &str) -> Option<DbAccess> {
        match self {
            Clearance::Operator => Some(DbAccess::Admin),
            Clearance::Databases(grants) => grants
                .iter()
                .filter(|g| g.matches(db))
                .map(|g| g.access)
                .max(),
        }
    }

    pub fn is_operator(&self) -> bool {
        matches!(self, Clearance::Operator)
    }
}

impl fmt::Display for Clearance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Clearance::Operator => f.write_str("operator"),
            Clearance::Databases(grants) if grants.is_empty() => f.write_str("nothing"),
            Clearance::Databases(grants) => {
                let parts: Vec<String> = grants
                    .iter()
                    .map(|g| format!("{}:{}", g.database, g.access.as_str()))
                    .collect();
                f.write_str(&parts.join(", "))
            }
        }
    }
}

/// The permission a route needs, declared with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Need {
    /// Any caller that authenticated (what it sees is then filtered: the database
    /// list shows only the databases it may read).
    Authenticated,
    /// This access to the database the path's `{db}` names.
    Database(DbAccess),
    /// The whole server: its statistics and metrics, the cluster.
    Operator,
}

impl Need {
    pub const READ: Need = Need::Database(DbAccess::Read);
    pub const READ_WRITE: Need = Need::Database(DbAccess::ReadWrite);
    pub const ADMIN: Need = Need::Database(DbAccess::Admin);

    /// The name the OpenAPI document's `x-kiln-permission` and error messages use.
    pub fn as_str(self) -> &'static str {
        match self {
            Need::Authenticated => "authenticated",
            Need::Database(a) => a.as_str(),
            Need::Operator => "operator",
        }
    }

    /// Whether `clearance` may make a request that needs this on `db` (the
    /// path's `{db}`; None on routes without one). `Err` says what was missing.
    pub fn check(self, clearance: &Clearance, db: Option<&str>) -> Result<(), Denied> {
        let ok = match self {
            Need::Authenticated => true,
            Need::Operator => clearance.is_operator(),
            Need::Database(wanted) => match db {
                Some(db) => clearance.access_to(db).is_some_and(|has| has >= wanted),
                // A database route always has `{db}`: fail closed if one does not.
                None => clearance.is_operator(),
            },
        };
        if ok {
            Ok(())
        } else {
            Err(Denied {
                need: self,
                database: db.map(str::to_string),
                has: db.and_then(|db| clearance.access_to(db)),
            })
        }
    }
}

/// A request its caller's clearance does not allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub need: Need,
    pub database: Option<String>,
    /// The access the caller has to that database, if any.
    pub has: Option<DbAccess>,
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.need, &self.database) {
            (Need::Database(_), Some(db)) => {
                write!(
                    f,
                    "this request needs {} on database {db:?}",
                    self.need.as_str()
                )?;
                match self.has {
                    Some(has) => write!(f, "; the caller has {}", has.as_str()),
                    None => f.write_str("; the caller has no access to it"),
                }
            }
            (need, _) => write!(
                f,
                "this request needs the {} permission (a key made with --operator)",
                need.as_str()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grants(list: &[&str]) -> Clearance {
        Clearance::Databases(list.iter().map(|g| DbGrant::parse(g).unwrap()).collect())
    }

    #[test]
    fn grants_parse_and_match_names_and_prefixes() {
        let c = grants(&["shop:read_write", "reports-*:read", "shop:read"]);
        assert_eq!(
            c.access_to("shop"),
            Some(DbAccess::ReadWrite),
            "highest grant wins"
        );
        assert_eq!(c.access_to("reports-2026"), Some(DbAccess::Read));
        assert_eq!(c.access_to("reports"), None, "the prefix includes the '-'");
        assert_eq!(c.access_to("shopping"), None, "a name is not a prefix");
        assert_eq!(
            grants(&["*:admin"]).access_to("anything"),
            Some(DbAccess::Admin)
        );
        assert_eq!(Clearance::Operator.access_to("x"), Some(DbAccess::Admin));
        for bad in [
            "shop",
            "shop:write",
            "Shop:read",
            "sh*op:read",
            "**:read",
            ":read",
            "-x*:read",
        ] {
            assert!(DbGrant::parse(bad).is_err(), "{bad} must be refused");
        }
        assert_eq!(c.to_string(), "shop:read_write, reports-*:read, shop:read");
    }

    #[test]
    fn needs_are_checked_against_the_clearance() {
        let c = grants(&["shop:read_write"]);
        assert!(Need::READ.check(&c, Some("shop")).is_ok());
        assert!(Need::READ_WRITE.check(&c, Some("shop")).is_ok());
        let denied = Need::ADMIN.check(&c, Some("shop")).unwrap_err();
        assert_eq!(
            denied.to_string(),
            "this request needs admin on database \"shop\"; the caller has read_write"
        );
        assert!(Need::READ.check(&c, Some("other")).is_err());
        assert!(Need::Operator.check(&c, None).is_err());
        assert!(Need::Authenticated.check(&c, None).is_ok());
        assert!(
            Need::READ.check(&c, None).is_err(),
            "no {{db}}: fail closed"
        );
        assert!(Need::Operator.check(&Clearance::Operator, None).is_ok());
    }

    #[test]
    fn a_key_file_without_clearances_reads_as_operator() {
        #[derive(Deserialize)]
        struct Rec {
            #[serde(default)]
            clearance: Clearance,
        }
        let old: Rec = serde_json::from_str("{}").unwrap();
        assert_eq!(old.clearance, Clearance::Operator);
        let json = serde_json::to_string(&grants(&["shop:read"])).unwrap();
        assert_eq!(
            json,
            r#"{"databases":[{"database":"shop","access":"read"}]}"#
        );
        assert_eq!(
            serde_json::to_string(&Clearance::Operator).unwrap(),
            r#""operator""#
        );
    }
}
