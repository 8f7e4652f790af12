// Package schema holds the embedded SQL migrations, one folder per dialect.
// Each dialect gets real DDL of its own; nothing is translated at run time.
package schema

import "embed"

// FS holds sqlite/NNNN_name.sql and postgres/NNNN_name.sql, in goose format.
//
//go:embed sqlite/*.sql postgres/*.sql
var FS embed.FS
