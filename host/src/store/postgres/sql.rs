//! The statements, the table and the claim functions, for one table name.

/// The statements, with the table name filled in once.
pub(super) struct Sql {
    pub(super) claim: String,
    pub(super) settle: String,
    pub(super) get: String,
    pub(super) replace: String,
    pub(super) delete: String,
    pub(super) list: String,
    pub(super) purge: String,
    pub(super) now: String,
}

impl Sql {
    pub(super) fn all(&self) -> [&str; 8] {
        [
            &self.claim,
            &self.settle,
            &self.get,
            &self.replace,
            &self.delete,
            &self.list,
            &self.purge,
            &self.now,
        ]
    }

    pub(super) fn new(t: &str) -> Sql {
        let statement = |name: &str| statement(STATEMENTS, name).replace("{t}", t);
        Sql {
            claim: statement("claim"),
            settle: statement("settle"),
            get: statement("get"),
            replace: statement("replace"),
            delete: statement("delete"),
            list: statement("list"),
            purge: statement("purge"),
            now: statement("now"),
        }
    }
}

/// The statements of the on-store layout, each after a `-- name: NAME` line.
const STATEMENTS: &str = include_str!("../../../../wit/store-layout/postgres/statements.sql");

/// The statement `name` of `file`: its text up to the next name, without the
/// final `;`. Panics if there is none (the file is part of the build).
fn statement(file: &str, name: &str) -> String {
    let marker = format!("-- name: {name}\n");
    let start = file
        .find(&marker)
        .expect("statements.sql names every statement")
        + marker.len();
    let text = &file[start..];
    let text = &text[..text.find("-- name: ").unwrap_or(text.len())];
    text.trim_end().trim_end_matches(';').to_owned()
}

/// Creates the table, its index, the claim functions and the schema
/// version, or brings a version 1 table (contract 0.1) up to version 2,
/// under an advisory lock so that guards starting together do not race on
/// `CREATE`: the layout's `schema.sql` for table `t`.
pub(super) fn schema(t: &str) -> String {
    SCHEMA.replace("{t}", t)
}

const SCHEMA: &str = include_str!("../../../../wit/store-layout/postgres/schema.sql");

#[cfg(test)]
mod tests {
    use super::super::PostgresStore;
    use super::*;

    #[test]
    fn the_schema_file_is_the_version_this_build_reads() {
        let line = format!(
            "INSERT INTO idem_schema VALUES ('{{t}}', {}) ",
            PostgresStore::SCHEMA_VERSION
        );
        assert!(
            SCHEMA.contains(&line),
            "schema.sql does not write version {}",
            PostgresStore::SCHEMA_VERSION
        );
    }

    #[test]
    fn every_statement_is_one_statement_with_the_table_filled_in() {
        let sql = Sql::new("idem_t");
        for text in sql.all() {
            assert!(
                !text.contains("{t}") && !text.contains("-- name:"),
                "{text}"
            );
            assert!(!text.trim_end().ends_with(';'), "{text}");
            // Every statement is on the table, but the server's clock.
            assert!(text.contains("idem_t") || text == sql.now, "{text}");
        }
    }
}
