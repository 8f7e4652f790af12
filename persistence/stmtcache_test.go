package persistence

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
)

// Cached statements answer each call with its own arguments, inside and
// outside transactions, after a refused one, and past the cache's bound.
func TestStmtCachingConn(t *testing.T) {
	ctx := context.Background()
	db, err := openCachingSQLite(sqliteDSN(filepath.Join(t.TempDir(), "c.db"), false, "FULL"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // every call on one connection: its cache is used
	if _, err := db.ExecContext(ctx, `CREATE TABLE kv (k TEXT PRIMARY KEY, v INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if _, err := db.ExecContext(ctx, `INSERT INTO kv (k, v) VALUES (?, ?)`, string(rune('a'+i%26))+string(rune('a'+i/26)), i); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO kv (k, v) VALUES (?, ?)`, "aa", 99); err == nil {
		t.Fatal("a duplicate key was inserted")
	}
	for i := range 50 {
		var v int
		if err := db.QueryRowContext(ctx, `SELECT v FROM kv WHERE k = ?`, string(rune('a'+i%26))+string(rune('a'+i/26))).Scan(&v); err != nil || v != i {
			t.Fatalf("row %d: %d, %v", i, v, err)
		}
	}
	// Two result sets of one statement, one after the other, and one left
	// open while a transaction uses the connection is impossible (one
	// connection): database/sql serializes them.
	rows, err := db.QueryContext(ctx, `SELECT k FROM kv WHERE v < ? ORDER BY v`, 3)
	if err != nil {
		t.Fatal(err)
	}
	var ks []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		ks = append(ks, k)
	}
	rows.Close()
	if len(ks) != 3 || ks[0] != "aa" || ks[2] != "ca" {
		t.Fatalf("first three keys: %v", ks)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE kv SET v = v + ? WHERE k = ?`, 100, "aa"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	var v int
	if err := db.QueryRowContext(ctx, `SELECT v FROM kv WHERE k = ?`, "aa").Scan(&v); err != nil || v != 0 {
		t.Fatalf("after a rollback: %d, %v", v, err)
	}
	if _, err := db.QueryContext(ctx, `SELEC nonsense`); err == nil {
		t.Fatal("a syntax error was accepted")
	}
	// More distinct statements than the cache holds.
	for i := range maxCachedStmts + 10 {
		var n int
		q := `SELECT COUNT(*) FROM kv WHERE v >= ` + strconv.Itoa(i)
		if err := db.QueryRowContext(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
}
