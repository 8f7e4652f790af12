package persistence_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// A new SQLite database is private to its owner: its directory 0700, the
// file and its -wal and -shm files 0600. An existing directory keeps its mode.
func TestSQLiteFilesArePrivate(t *testing.T) {
	mode := func(path string) fs.FileMode {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	existing := t.TempDir()
	if err := os.Chmod(existing, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{filepath.Join(t.TempDir(), "new", "data"), existing} {
		path := filepath.Join(dir, "identityd.db")
		s := dbtest.Store(t, "sqlite://"+path)
		if err := s.SetSetting(context.Background(), "k", "v"); err != nil { // the log and shared memory exist now
			t.Fatal(err)
		}
		for _, f := range []string{path, path + "-wal", path + "-shm"} {
			if m := mode(f); m != 0o600 {
				t.Errorf("%s: mode %v, want 0600", filepath.Base(f), m)
			}
		}
		want := fs.FileMode(0o700)
		if dir == existing {
			want = 0o755
		}
		if m := mode(dir); m != want {
			t.Errorf("directory %s: mode %v, want %v", dir, m, want)
		}
	}
}

// A path holding what a file: URI reads as syntax ("#" starts a fragment,
// "%" an escape) opens that very file, not a shorter one: a test named
// "x#01" once shared a database with every other.
func TestOpenPathWithURISyntax(t *testing.T) {
	parent := t.TempDir()
	path := filepath.Join(parent, "data#1 %41", "identityd.db")
	db, _, err := persistence.Open(context.Background(), "sqlite://"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE here (x INTEGER)`); err != nil {
		t.Fatal(err)
	}
	if entries, err := os.ReadDir(parent); err != nil || len(entries) != 1 || entries[0].Name() != "data#1 %41" {
		t.Fatalf("files beside the database's directory: %v %v", entries, err)
	}
	if _, err := os.Stat(path + "-wal"); err != nil {
		t.Fatalf("the database is not at its path: %v", err)
	}
}
