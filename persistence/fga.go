package persistence

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"time"

	"github.com/openfga/openfga/assets"
	"github.com/openfga/openfga/pkg/storage"
	"github.com/openfga/openfga/pkg/storage/postgres"
	"github.com/openfga/openfga/pkg/storage/sqlcommon"
	"github.com/openfga/openfga/pkg/storage/sqlite"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// OpenFGA, the relationship engine behind fine-grained authorization
// (extensions/authz), keeps its tuples and models in the database identityd
// uses, through its own datastore of each dialect: SQLite's for the embedded
// default, PostgreSQL's in production. Its tables sit beside ours under
// their own names (tuple, store, authorization_model, assertion, changelog)
// and their migrations are OpenFGA's, recorded in a version table of their
// own, so neither migration set sees the other's (docs/decisions.md).

// FGAVersionTable records which of OpenFGA's migrations were applied; ours
// are in goose's default goose_db_version.
const FGAVersionTable = "openfga_goose_db_version"

// fgaLockID is the PostgreSQL advisory lock OpenFGA's migrations run under:
// not goose's default, which ours hold, so that a replica migrating one set
// never waits on one migrating the other.
const fgaLockID int64 = 0x6964656e74666761 // "identfga"

// MigrateFGA applies OpenFGA's embedded migrations of the dialect that are
// not yet applied, and reports the versions it applied.
func MigrateFGA(ctx context.Context, db *sql.DB, dialect Dialect) ([]int64, error) {
	dir := assets.SqliteMigrationDir
	gd := goose.DialectSQLite3
	opts := []goose.ProviderOption{goose.WithTableName(FGAVersionTable)}
	if dialect == Postgres {
		dir, gd = assets.PostgresMigrationDir, goose.DialectPostgres
		locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(fgaLockID), lock.WithLockTimeout(1, 300))
		if err != nil {
			return nil, err
		}
		opts = append(opts, goose.WithSessionLocker(locker))
	}
	sub, err := fs.Sub(assets.EmbedMigrations, dir)
	if err != nil {
		return nil, err
	}
	p, err := goose.NewProvider(gd, db, sub, opts...)
	if err != nil {
		return nil, err
	}
	results, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate OpenFGA: %w", err)
	}
	applied := make([]int64, 0, len(results))
	for _, r := range results {
		applied = append(applied, r.Source.Version)
	}
	return applied, nil
}

// OpenFGADatastore opens OpenFGA's datastore on the database named by rawURL
// (see ParseURL), with its own connections: its queries never wait for a
// connection ours hold, nor ours for its. MigrateFGA must have run.
func OpenFGADatastore(rawURL string) (storage.OpenFGADatastore, error) {
	dialect, dsn, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	switch dialect {
	case SQLite:
		// Four connections: SQLite writes one at a time whatever the pool,
		// and reads of one small engine need no more.
		cfg := sqlcommon.NewConfig(sqlcommon.WithMaxOpenConns(4), sqlcommon.WithMaxIdleConns(4))
		db, err := openCachingSQLite(sqliteDSN(dsn, false, "FULL"))
		if err != nil {
			return nil, err
		}
		db.SetMaxOpenConns(4)
		db.SetMaxIdleConns(4)
		return sqlite.NewWithDB(db, cfg)
	default:
		// pgx reads the URL's other parameters (search_path among them)
		// as run-time settings, as lib/pq does for ours: OpenFGA's tables
		// are found in the schema identityd's are.
		cfg := sqlcommon.NewConfig(sqlcommon.WithMaxOpenConns(16), sqlcommon.WithMinIdleConns(1),
			sqlcommon.WithConnMaxIdleTime(5*time.Minute), sqlcommon.WithPingRetryMaxElapsedTime(10*time.Second))
		return postgres.New(dsn, cfg)
	}
}
