package persistence_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// notCompared are tables one dialect has by design (SQLite's audit inbox,
// persistence/auditinbox.go; PostgreSQL's passkey ceremonies, which SQLite
// keeps in memory, persistence/passkeys.go) and the migration tool's own.
var notCompared = []string{"agent_audit_inbox", "passkey_challenges", "goose_db_version"}

// The two schema trees define the same tables with the same columns, each
// column nullable in both or in neither.
func TestSchemaTreesAgree(t *testing.T) {
	urls := dbtest.URLs(t)
	if _, ok := urls["postgres"]; !ok {
		t.Skip("TEST_DATABASE_URL is not set; the PostgreSQL tree cannot be compared")
	}
	shapes := map[string]map[string]string{}
	for name, u := range urls {
		ctx := context.Background()
		db, dialect, err := persistence.Open(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := persistence.Migrate(ctx, db.DB, dialect); err != nil {
			t.Fatal(err)
		}
		shape := map[string]string{} // "table.column" → "null" or "not null"
		if dialect == persistence.SQLite {
			var tables []string
			if err := db.Select(&tables, `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`); err != nil {
				t.Fatal(err)
			}
			for _, table := range tables {
				var cols []struct {
					CID     int     `db:"cid"`
					Name    string  `db:"name"`
					Type    string  `db:"type"`
					NotNull bool    `db:"notnull"`
					Default *string `db:"dflt_value"`
					PK      int     `db:"pk"`
				}
				if err := db.Select(&cols, fmt.Sprintf(`PRAGMA table_info(%q)`, table)); err != nil {
					t.Fatal(err)
				}
				for _, c := range cols {
					shape[table+"."+c.Name] = nullability(c.NotNull || c.PK > 0)
				}
			}
		} else {
			var cols []struct {
				Table    string `db:"table_name"`
				Column   string `db:"column_name"`
				Nullable string `db:"is_nullable"`
			}
			if err := db.Select(&cols, `SELECT table_name, column_name, is_nullable FROM information_schema.columns WHERE table_schema = current_schema()`); err != nil {
				t.Fatal(err)
			}
			for _, c := range cols {
				shape[c.Table+"."+c.Column] = nullability(c.Nullable == "NO")
			}
		}
		shapes[name] = shape
	}
	for _, shape := range shapes {
		for key := range shape {
			if slices.Contains(notCompared, strings.Split(key, ".")[0]) {
				delete(shape, key)
			}
		}
	}
	var diffs []string
	for _, key := range slices.Sorted(maps.Keys(shapes["sqlite"])) {
		if pg, ok := shapes["postgres"][key]; !ok {
			diffs = append(diffs, key+": only in the SQLite tree")
		} else if pg != shapes["sqlite"][key] {
			diffs = append(diffs, fmt.Sprintf("%s: %s in SQLite, %s in PostgreSQL", key, shapes["sqlite"][key], pg))
		}
	}
	for _, key := range slices.Sorted(maps.Keys(shapes["postgres"])) {
		if _, ok := shapes["sqlite"][key]; !ok {
			diffs = append(diffs, key+": only in the PostgreSQL tree")
		}
	}
	if len(diffs) > 0 {
		t.Fatalf("the schema trees differ:\n%s", strings.Join(diffs, "\n"))
	}
}

func nullability(notNull bool) string {
	if notNull {
		return "not null"
	}
	return "null"
}
