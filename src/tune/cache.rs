//! The compilation cache: tuned options and compiled programs in one SQLite
//! database that several processes share.
//!
//! Key: `key` = hash of (canonical program, parameter values, target
//! architecture) — see [`canon`]; rows are (key, options), so a key holds
//! every measured option set and one of them marked `tuned` (the best a
//! `tune` found). Table `artifacts` holds compiled programs (the JSON of
//! [`super::artifact`]) by (key, options, spelling of the names): a cache
//! hit with the same spelling returns one without compiling; a renamed
//! program reuses the tuned options, compiles, and adds its own.
//!
//! Concurrency: WAL journal, a busy timeout, and every write in one
//! `BEGIN IMMEDIATE` transaction, so writers from several processes and
//! threads queue instead of failing.
//!
//! Location: `--cache PATH`, else `$POLYFUSE_CACHE`, else
//! `$XDG_CACHE_HOME/polyfuse/cache.sqlite`, else
//! `$HOME/.cache/polyfuse/cache.sqlite`. `--no-cache` or
//! `POLYFUSE_CACHE=off` disables it.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::{Deserialize, Serialize};

use super::{artifact, canon, Variant};
use crate::error::{Error, Result};
use crate::frontend::ast::Program;
use crate::pipeline::Compiled;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS entries (
    key      TEXT NOT NULL,
    options  TEXT NOT NULL,
    program  TEXT NOT NULL,
    params   TEXT NOT NULL,
    arch     TEXT NOT NULL,
    name     TEXT NOT NULL,
    time_us  REAL,
    tuned    INTEGER NOT NULL DEFAULT 0,
    updated  INTEGER NOT NULL,
    PRIMARY KEY (key, options)
);
CREATE INDEX IF NOT EXISTS entries_tuned ON entries (key, tuned);
CREATE TABLE IF NOT EXISTS artifacts (
    key      TEXT NOT NULL,
    options  TEXT NOT NULL,
    spelling TEXT NOT NULL,
    artifact TEXT NOT NULL,
    updated  INTEGER NOT NULL,
    PRIMARY KEY (key, options, spelling)
);
";

/// One line of [`Cache::export`], which [`Cache::import`] reads: an
/// entry with its compiled programs.
#[derive(Serialize, Deserialize)]
struct Exported {
    key: String,
    options: String,
    program: String,
    params: String,
    arch: String,
    name: String,
    time_us: Option<f64>,
    #[serde(default)]
    tuned: bool,
    /// When the entry was written (seconds since 1970); not imported.
    #[serde(default)]
    updated: i64,
    #[serde(default)]
    artifacts: Vec<ExportedArtifact>,
}

/// A compiled program of an exported entry, for one spelling.
#[derive(Serialize, Deserialize)]
struct ExportedArtifact {
    spelling: String,
    artifact: String,
}

/// What identifies a program for the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    /// Hash of `program`, `params` and `arch` (32 hex digits).
    pub key: String,
    /// The canonical form ([`canon::canonical`]).
    pub program: String,
    pub params: String,
    /// `cpu`, `emulate`, or the GPU's `sm_XX`.
    pub arch: String,
    /// The program's name (shown by `cache list`).
    pub name: String,
    /// [`canon::spelling`]: the generated code is reused only for it.
    pub spelling: String,
}

impl Key {
    pub fn new(program: &Program, arch: &str) -> Key {
        let text = canon::canonical(program);
        let params = canon::param_values(program);
        Key {
            key: canon::hash_hex(&format!("{text}\nparams {params}\narch {arch}\n")),
            program: text,
            params,
            arch: arch.to_string(),
            name: program.name.clone(),
            spelling: canon::spelling(program),
        }
    }
}

/// One row, as `cache list` and `cache export` show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub key: String,
    pub name: String,
    pub arch: String,
    pub params: String,
    pub options: String,
    pub time_us: Option<f64>,
    pub tuned: bool,
    pub has_artifact: bool,
    pub updated: i64,
}

/// The cache's file: `explicit`, else the environment, else the default;
/// None when disabled.
pub fn location(explicit: Option<&Path>, disabled: bool) -> Option<PathBuf> {
    if disabled {
        return None;
    }
    if let Some(p) = explicit {
        return Some(p.to_path_buf());
    }
    if let Some(v) = std::env::var_os("POLYFUSE_CACHE") {
        let s = v.to_string_lossy();
        if s.is_empty() || s == "off" || s == "0" || s == "none" {
            return None;
        }
        return Some(PathBuf::from(v));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("polyfuse").join("cache.sqlite"))
}

/// An open cache.
pub struct Cache {
    conn: Connection,
    path: PathBuf,
}

/// How long a connection waits for another one's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether `e` is SQLite's "busy" or "locked": another connection holds
/// the lock (worth another try).
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

fn db_error(path: &Path) -> impl Fn(rusqlite::Error) -> Error + '_ {
    move |e| Error::Environment(format!("cache {}: {e}", path.display()))
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl Cache {
    /// Opens (creating it and its folder when missing) the cache at `path`.
    pub fn open(path: &Path) -> Result<Cache> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                Error::Environment(format!(
                    "cannot create the cache folder {}: {e}",
                    dir.display()
                ))
            })?;
        }
        let err = db_error(path);
        // SQLite answers "database is locked" without waiting (the busy
        // handler is not called) when several connections switch a new
        // file to WAL or create its schema at the same moment; those steps
        // are retried for up to the busy timeout.
        let start = std::time::Instant::now();
        let conn = loop {
            match Self::connect(path) {
                Ok(conn) => break conn,
                Err(e) if is_busy(&e) && start.elapsed() < BUSY_TIMEOUT => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(err(e)),
            }
        };
        Ok(Cache {
            conn,
            path: path.to_path_buf(),
        })
    }

    /// One attempt at opening `path`: WAL mode, then the schema unless it
    /// is there (a lookup then takes no write lock).
    fn connect(path: &Path) -> rusqlite::Result<Connection> {
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        // WAL: readers do not block the writer and the reverse.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        let tables: i64 = conn.query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('entries', 'artifacts')",
            [],
            |r| r.get(0),
        )?;
        if tables < 2 {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute_batch(SCHEMA)?;
            tx.commit()?;
        }
        Ok(conn)
    }

    /// Opens the cache at `path` only when the file exists (lookups never
    /// create one).
    pub fn open_existing(path: &Path) -> Result<Option<Cache>> {
        if !path.is_file() {
            return Ok(None);
        }
        Cache::open(path).map(Some)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction (waiting for other
    /// writers up to the busy timeout).
    fn write<T>(
        &mut self,
        f: impl FnOnce(&rusqlite::Transaction) -> rusqlite::Result<T>,
    ) -> Result<T> {
        let path = self.path.clone();
        let err = db_error(&path);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&err)?;
        let out = f(&tx).map_err(&err)?;
        tx.commit().map_err(&err)?;
        Ok(out)
    }

    /// The tuned options of `key` and their time.
    pub fn best(&self, key: &Key) -> Result<Option<(Variant, Option<f64>)>> {
        let row: Option<(String, Option<f64>)> = self
            .conn
            .query_row(
                "SELECT options, time_us FROM entries WHERE key = ?1 AND tuned = 1 AND program = ?2",
                params![key.key, key.program],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(db_error(&self.path))?;
        match row {
            None => Ok(None),
            Some((text, t)) => match Variant::parse(&text) {
                Ok(v) => Ok(Some((v, t))),
                // An entry written by another version: not ours to use.
                Err(_) => Ok(None),
            },
        }
    }

    /// The compiled program of (`key`, `variant`) when the row holds one for
    /// this spelling.
    pub fn compiled(
        &self,
        key: &Key,
        variant: &Variant,
        program: &Program,
    ) -> Result<Option<Compiled>> {
        let text: Option<String> = self
            .conn
            .query_row(
                "SELECT a.artifact FROM artifacts a JOIN entries e ON a.key = e.key AND a.options = e.options
                 WHERE a.key = ?1 AND a.options = ?2 AND a.spelling = ?3 AND e.program = ?4",
                params![key.key, variant.canonical(), key.spelling, key.program],
                |r| r.get(0),
            )
            .optional()
            .map_err(db_error(&self.path))?;
        let Some(text) = text else {
            return Ok(None);
        };
        Ok(artifact::from_text(program, &text).ok())
    }

    /// Records a measurement (or only a compiled program, `time_us` None)
    /// of `variant`; keeps the smaller of two times.
    pub fn record(
        &mut self,
        key: &Key,
        variant: &Variant,
        time_us: Option<f64>,
        compiled: Option<&Compiled>,
    ) -> Result<()> {
        let art = compiled.map(artifact::to_text).transpose()?;
        self.write(|tx| upsert(tx, key, variant, time_us, art.as_deref(), false))
    }

    /// Records `variant` with its time and compiled program and makes it
    /// the tuned options of `key` unless the current tuned entry (of
    /// another option set) is faster, in one transaction. Returns the tuned
    /// options and time afterwards.
    pub fn set_best(
        &mut self,
        key: &Key,
        variant: &Variant,
        time_us: f64,
        compiled: Option<&Compiled>,
    ) -> Result<(Variant, f64)> {
        let art = compiled.map(artifact::to_text).transpose()?;
        let options = variant.canonical();
        let kept: Option<(String, f64)> = self.write(|tx| {
            let current: Option<(String, Option<f64>)> = tx
                .query_row(
                    "SELECT options, time_us FROM entries WHERE key = ?1 AND tuned = 1",
                    params![key.key],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let keep = match current {
                Some((o, Some(t))) if o != options && t < time_us => Some((o, t)),
                _ => None,
            };
            upsert(
                tx,
                key,
                variant,
                Some(time_us),
                art.as_deref(),
                keep.is_none(),
            )?;
            if keep.is_none() {
                tx.execute(
                    "UPDATE entries SET tuned = 0 WHERE key = ?1 AND options <> ?2",
                    params![key.key, options],
                )?;
            }
            Ok(keep)
        })?;
        Ok(
            match kept.and_then(|(o, t)| Variant::parse(&o).ok().map(|v| (v, t))) {
                Some(k) => k,
                None => (variant.clone(), time_us),
            },
        )
    }

    /// Every row, newest first.
    pub fn list(&self) -> Result<Vec<Entry>> {
        let err = db_error(&self.path);
        let mut st = self
            .conn
            .prepare(
                "SELECT key, name, arch, params, options, time_us, tuned,
                        EXISTS (SELECT 1 FROM artifacts a WHERE a.key = e.key AND a.options = e.options), updated
                 FROM entries e ORDER BY updated DESC, key, options",
            )
            .map_err(&err)?;
        let rows = st
            .query_map([], |r| {
                Ok(Entry {
                    key: r.get(0)?,
                    name: r.get(1)?,
                    arch: r.get(2)?,
                    params: r.get(3)?,
                    options: r.get(4)?,
                    time_us: r.get(5)?,
                    tuned: r.get::<_, i64>(6)? != 0,
                    has_artifact: r.get(7)?,
                    updated: r.get(8)?,
                })
            })
            .map_err(&err)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(&err)
    }

    /// Removes every row; returns how many there were.
    pub fn clear(&mut self) -> Result<usize> {
        self.write(|tx| {
            tx.execute("DELETE FROM artifacts", [])?;
            tx.execute("DELETE FROM entries", [])
        })
    }

    /// Every row as JSON lines, with its compiled programs, for `import`
    /// elsewhere.
    pub fn export(&self) -> Result<String> {
        let err = db_error(&self.path);
        let mut st = self
            .conn
            .prepare(
                "SELECT key, options, program, params, arch, name, time_us, tuned, updated
                 FROM entries ORDER BY key, options",
            )
            .map_err(&err)?;
        let mut arts = self
            .conn
            .prepare("SELECT spelling, artifact FROM artifacts WHERE key = ?1 AND options = ?2 ORDER BY spelling")
            .map_err(&err)?;
        let rows = st
            .query_map([], |r| {
                Ok(Exported {
                    key: r.get(0)?,
                    options: r.get(1)?,
                    program: r.get(2)?,
                    params: r.get(3)?,
                    arch: r.get(4)?,
                    name: r.get(5)?,
                    time_us: r.get(6)?,
                    tuned: r.get::<_, i64>(7)? != 0,
                    updated: r.get(8)?,
                    artifacts: Vec::new(),
                })
            })
            .map_err(&err)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(&err)?;
        let mut out = String::new();
        for mut row in rows {
            row.artifacts = arts
                .query_map(params![row.key, row.options], |r| {
                    Ok(ExportedArtifact {
                        spelling: r.get(0)?,
                        artifact: r.get(1)?,
                    })
                })
                .map_err(&err)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(&err)?;
            let line = serde_json::to_string(&row).map_err(|e| Error::Internal(e.to_string()))?;
            out.push_str(&line);
            out.push('\n');
        }
        Ok(out)
    }

    /// Imports JSON lines of [`Cache::export`] in one transaction: a row
    /// replaces an existing one only with a smaller time; an imported tuned
    /// row becomes the key's tuned one when it is faster than the current.
    /// Returns the rows read. `file` names the input in messages.
    pub fn import(&mut self, text: &str, file: &str) -> Result<usize> {
        let mut rows = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = |m: &str| Error::Input {
                file: file.to_string(),
                message: format!("line {}: {m}", n + 1),
            };
            let row: Exported = serde_json::from_str(line).map_err(|e| bad(&e.to_string()))?;
            Variant::parse(&row.options).map_err(|m| bad(&format!("options: {m}")))?;
            let key = canon::hash_hex(&format!(
                "{}\nparams {}\narch {}\n",
                row.program, row.params, row.arch
            ));
            if key != row.key {
                return Err(bad(
                    "the key does not match the program, parameters and architecture",
                ));
            }
            rows.push((
                Key {
                    key,
                    program: row.program,
                    params: row.params,
                    arch: row.arch,
                    name: row.name,
                    spelling: String::new(),
                },
                row.options,
                row.time_us,
                row.tuned,
                row.artifacts
                    .into_iter()
                    .map(|a| (a.spelling, a.artifact))
                    .collect::<Vec<_>>(),
            ));
        }
        let n = rows.len();
        self.write(|tx| {
            for (key, options, time, tuned, arts) in &rows {
                let variant = Variant::parse(options).unwrap_or_default();
                upsert(tx, key, &variant, *time, None, false)?;
                for (spelling, art) in arts {
                    let key = Key {
                        spelling: spelling.clone(),
                        ..key.clone()
                    };
                    upsert(tx, &key, &variant, None, Some(art), false)?;
                }
                if *tuned {
                    let current: Option<Option<f64>> = tx
                        .query_row(
                            "SELECT time_us FROM entries WHERE key = ?1 AND tuned = 1",
                            params![key.key],
                            |r| r.get(0),
                        )
                        .optional()?;
                    let better = match (current, time) {
                        (None, _) | (Some(None), _) => true,
                        (Some(Some(c)), Some(t)) => t < &c,
                        (Some(Some(_)), None) => false,
                    };
                    if better {
                        tx.execute(
                            "UPDATE entries SET tuned = 0 WHERE key = ?1",
                            params![key.key],
                        )?;
                        tx.execute(
                            "UPDATE entries SET tuned = 1 WHERE key = ?1 AND options = ?2",
                            params![key.key, options],
                        )?;
                    }
                }
            }
            Ok(())
        })?;
        Ok(n)
    }
}

/// Inserts or updates one row: a time replaces a larger or missing one, an
/// artifact replaces the row's (with its spelling).
fn upsert(
    tx: &rusqlite::Transaction,
    key: &Key,
    variant: &Variant,
    time_us: Option<f64>,
    art: Option<&str>,
    tuned: bool,
) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO entries (key, options, program, params, arch, name, time_us, tuned, updated)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT (key, options) DO UPDATE SET
           time_us = CASE WHEN excluded.time_us IS NOT NULL AND (time_us IS NULL OR excluded.time_us < time_us)
                          THEN excluded.time_us ELSE time_us END,
           tuned = MAX(tuned, excluded.tuned),
           name = excluded.name,
           updated = excluded.updated",
        params![
            key.key,
            variant.canonical(),
            key.program,
            key.params,
            key.arch,
            key.name,
            time_us,
            tuned as i64,
            now(),
        ],
    )?;
    if let Some(art) = art {
        tx.execute(
            "INSERT INTO artifacts (key, options, spelling, artifact, updated) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (key, options, spelling) DO UPDATE SET artifact = excluded.artifact, updated = excluded.updated",
            params![key.key, variant.canonical(), key.spelling, art, now()],
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(json: &str) -> Program {
        crate::frontend::load_str(json, "<test>").unwrap()
    }

    const ADD: &str = r#"{"name": "add", "params": {"N": 8},
        "inputs": {"A": {"dtype": "f32", "shape": ["N"]}, "B": {"dtype": "f32", "shape": ["N"]}},
        "outputs": {"C": {"dtype": "f32", "shape": ["N"]}},
        "body": ["C(i) = A(i) + B(i)"]}"#;

    fn temp_db(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("polyfuse-cache-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir.join("cache.sqlite")
    }

    #[test]
    fn best_options_and_compiled_programs() {
        let path = temp_db("unit");
        let mut cache = Cache::open(&path).unwrap();
        let p = program(ADD);
        let key = Key::new(&p, "cpu");
        assert!(cache.best(&key).unwrap().is_none());
        let slow = Variant::parse("tile=8").unwrap();
        let fast = Variant::parse("tile=4").unwrap();
        cache.record(&key, &slow, Some(9.0), None).unwrap();
        let compiled = crate::compile(&p, &fast.options(false)).unwrap();
        cache.set_best(&key, &fast, 3.0, Some(&compiled)).unwrap();
        assert_eq!(cache.best(&key).unwrap(), Some((fast.clone(), Some(3.0))));
        let hit = cache.compiled(&key, &fast, &p).unwrap().unwrap();
        assert_eq!(hit.kernel_c, compiled.kernel_c);
        // another architecture or other sizes: a miss
        assert!(cache.best(&Key::new(&p, "sm_90")).unwrap().is_none());
        let bigger = program(&ADD.replace("\"N\": 8", "\"N\": 16"));
        assert!(cache.best(&Key::new(&bigger, "cpu")).unwrap().is_none());
        // renamed: the options, not the code
        let renamed = program(&ADD.replace("C(i) = A(i) + B(i)", "C(x) = A(x) + B(x)"));
        let rkey = Key::new(&renamed, "cpu");
        assert_eq!(rkey.key, key.key);
        assert!(cache.best(&rkey).unwrap().is_some());
        assert!(cache.compiled(&rkey, &fast, &renamed).unwrap().is_none());
        // a slower best of a later run does not replace a faster one
        let slower = Variant::parse("tile=2").unwrap();
        assert_eq!(
            cache.set_best(&key, &slower, 5.0, None).unwrap(),
            (fast.clone(), 3.0)
        );
        assert_eq!(cache.best(&key).unwrap(), Some((fast.clone(), Some(3.0))));
        cache.clear().unwrap();
        cache.set_best(&key, &fast, 3.0, Some(&compiled)).unwrap();
        cache.record(&key, &slow, Some(9.0), None).unwrap();
        // export, clear, import
        let text = cache.export().unwrap();
        assert_eq!(text.lines().count(), 2);
        assert_eq!(cache.clear().unwrap(), 2);
        assert!(cache.best(&key).unwrap().is_none());
        assert_eq!(cache.import(&text, "x").unwrap(), 2);
        assert_eq!(cache.best(&key).unwrap(), Some((fast, Some(3.0))));
        assert!(cache.import("{\"key\": 1}", "x").is_err());
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    /// An entry stored in another artifact format (version 2, written by
    /// hand before serde), or text that is no artifact, is a miss, never
    /// misread; the compiled program survives an export and an import.
    #[test]
    fn an_entry_of_another_artifact_format_is_a_miss() {
        let path = temp_db("format");
        let mut cache = Cache::open(&path).unwrap();
        let p = program(ADD);
        let key = Key::new(&p, "cpu");
        let v = Variant::default();
        let compiled = crate::compile(&p, &v.options(false)).unwrap();
        cache.record(&key, &v, Some(1.0), Some(&compiled)).unwrap();
        let text = cache.export().unwrap();
        cache.clear().unwrap();
        cache.import(&text, "x").unwrap();
        let hit = cache.compiled(&key, &v, &p).unwrap().unwrap();
        assert_eq!(hit.kernel_c, compiled.kernel_c);
        assert_eq!(hit.tree, compiled.tree);
        let mut old = artifact::to_json(&compiled).unwrap();
        old["version"] = 2.into();
        for stored in [old.to_string(), "not an artifact".to_string()] {
            cache
                .conn
                .execute("UPDATE artifacts SET artifact = ?1", params![stored])
                .unwrap();
            assert!(cache.compiled(&key, &v, &p).unwrap().is_none(), "{stored}");
        }
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}
