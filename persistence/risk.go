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

// RecordRiskSignIn remembers a successful sign-in in one transaction: the
// device (deviceHash; nil for a sign-in without a device cookie), first
// seen now or seen again, and the sign-in's location; then it trims the
// person's devices and sign-ins to the keep most recent of each. Two
// sign-ins of one person at the same moment may leave one row more than
// keep until the next: the bound is for size, not a rule.
func (s *Store) RecordRiskSignIn(ctx context.Context, userID string, deviceHash []byte, loc SignInLocation, keep int) error {
	at := loc.At.UTC()
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		if deviceHash != nil {
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO user_devices (user_id, device_hash, first_seen_at, last_seen_at) VALUES (?, ?, ?, ?)
				ON CONFLICT (user_id, device_hash) DO UPDATE SET last_seen_at =
					CASE WHEN excluded.last_seen_at > user_devices.last_seen_at THEN excluded.last_seen_at ELSE user_devices.last_seen_at END`),
				userID, deviceHash, at, at); err != nil {
				return nil, err
			}
			if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM user_devices WHERE user_id = ? AND device_hash NOT IN (
				SELECT device_hash FROM user_devices WHERE user_id = ? ORDER BY last_seen_at DESC, device_hash DESC LIMIT ?)`),
				userID, userID, keep); err != nil {
				return nil, err
			}
		}
		// A v7 id orders sign-ins recorded at the same instant.
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO sign_in_locations (id, user_id, at, country, lat, lon) VALUES (?, ?, ?, ?, ?, ?)`),
			uuid.Must(uuid.NewV7()).String(), userID, at, loc.Country, loc.Lat, loc.Lon); err != nil {
			return nil, err
		}
		_, err := tx.ExecContext(ctx, s.q(`DELETE FROM sign_in_locations WHERE user_id = ? AND id NOT IN (
			SELECT id FROM sign_in_locations WHERE user_id = ? ORDER BY at DESC, id DESC LIMIT ?)`),
			userID, userID, keep)
		return nil, err
	})
}
