package persistence

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
)

// EventRiskTriggered is the auth event of a sign-in risk rule that
// triggered (extensions/risk); reason is the rule's name.
const EventRiskTriggered = "risk_triggered"

// SignInLocation is one successful sign-in of a person as the risk engine
// remembers it: when, and where its address was located. Country is ""
// (and Lat, Lon 0) when it was not located.
type SignInLocation struct {
	At      time.Time `db:"at"`
	Country string    `db:"country"`
	Lat     float64   `db:"lat"`
	Lon     float64   `db:"lon"`
}

// RiskHistory is what the risk engine compares a sign-in with: the keyed
// hashes of the person's known devices, most recently seen first, and their
// recent sign-ins, most recent first.
type RiskHistory struct {
	DeviceHashes [][]byte
	SignIns      []SignInLocation
}

// RiskHistory reads a person's devices and recent sign-ins (empty for a
// person with none, or no such person).
func (s *Store) RiskHistory(ctx context.Context, userID string) (*RiskHistory, error) {
	h := &RiskHistory{DeviceHashes: [][]byte{}, SignIns: []SignInLocation{}}
	q := s.conn(ctx)
	if err := q.SelectContext(ctx, &h.DeviceHashes, s.q(`SELECT device_hash FROM user_devices WHERE user_id = ?
		ORDER BY last_seen_at DESC, device_hash DESC`), userID); err != nil {
		return nil, mapError(err)
	}
	if err := q.SelectContext(ctx, &h.SignIns, s.q(`SELECT at, country, lat, lon FROM sign_in_locations WHERE user_id = ?
		ORDER BY at DESC, id DESC`), userID); err != nil {
		return nil, mapError(err)
	}
	return h, nil
}

// RiskSignIn is a successful sign-in as the risk rules remember it: the
// device (DeviceHash; nil for a sign-in without a device cookie), first seen
// now or seen again, and the sign-in's location. A person keeps the Keep
// most recent devices and sign-ins. Two sign-ins of one person at the same
// moment may leave one row more than Keep until the next: the bound is for
// size, not a rule.
type RiskSignIn struct {
	UserID     string
	DeviceHash []byte
	Location   SignInLocation
	Keep       int
}

// RecordRiskSignIn remembers a successful sign-in, in one transaction.
func (s *Store) RecordRiskSignIn(ctx context.Context, r RiskSignIn) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		then, rows := r.writes()
		return nil, s.writeFlow(ctx, tx, &flowWrite{then: then, rows: rows})
	})
}

// writes are what remembering the sign-in writes: statements, in order (the
// device seen and the devices trimmed to Keep; a located sign-in and the
// sign-ins trimmed to Keep), and new rows.
//
// A sign-in from an address that was not located tells the rules only that
// the person has signed in before (they skip it when comparing places), so
// a person's unlocated sign-ins share one row, keyed by the person's id and
// written by the first of them: a sign-in that adds nothing writes nothing
// (without a geolocation database, that is every sign-in but the first).
func (r RiskSignIn) writes() (then []statement, rows []row) {
	at := r.Location.At.UTC()
	if r.DeviceHash != nil {
		then = append(then, statement{sql: `INSERT INTO user_devices (user_id, device_hash, first_seen_at, last_seen_at) VALUES (?, ?, ?, ?)
			ON CONFLICT (user_id, device_hash) DO UPDATE SET last_seen_at =
				CASE WHEN excluded.last_seen_at > user_devices.last_seen_at THEN excluded.last_seen_at ELSE user_devices.last_seen_at END`,
			args: []any{r.UserID, r.DeviceHash, at, at}},
			statement{sql: `DELETE FROM user_devices WHERE user_id = ? AND device_hash NOT IN (
				SELECT device_hash FROM user_devices WHERE user_id = ? ORDER BY last_seen_at DESC, device_hash DESC LIMIT ?)`,
				args: []any{r.UserID, r.UserID, r.Keep}})
	}
	if r.Location.Country == "" {
		return then, []row{{table: "sign_in_locations", columns: signInLocationColumns, suffix: " ON CONFLICT (id) DO NOTHING",
			args: []any{r.UserID, r.UserID, at, "", 0.0, 0.0}}}
	}
	return append(then, statement{sql: `INSERT INTO sign_in_locations (` + signInLocationColumns + `) VALUES (?, ?, ?, ?, ?, ?)`,
		args: []any{uuid.Must(uuid.NewV7()).String(), r.UserID, at, r.Location.Country, r.Location.Lat, r.Location.Lon}},
		// Older than the Keep-th most recent: the index on (user_id, at)
		// finds it and them without a sort (sign-ins of the Keep-th's very
		// instant all stay).
		statement{sql: `DELETE FROM sign_in_locations WHERE user_id = ? AND at < (
			SELECT at FROM sign_in_locations WHERE user_id = ? ORDER BY at DESC LIMIT 1 OFFSET ?)`,
			args: []any{r.UserID, r.UserID, r.Keep - 1}}), nil
}

const signInLocationColumns = "id, user_id, at, country, lat, lon"
