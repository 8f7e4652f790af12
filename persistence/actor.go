package persistence

import (
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"strings"
)

// Actor is who did something, as audit trails and event logs keep it: the
// subject the request spoke for, the client that made it, the agent when an
// agent acted, the person's sign-in session, and a delegated token's act
// chain. Stored as JSON text in the actor columns; rows written before it
// hold a bare client id, read as {ClientID}.
type Actor struct {
	Subject   string `json:"sub,omitempty"`
	ClientID  string `json:"clientId,omitempty"`
	AgentID   string `json:"agentId,omitempty"`
	SessionID string `json:"sessionId,omitempty"`
	Act       any    `json:"act,omitempty"`
}

// IsZero tells whether no actor is recorded (entries the system writes).
func (a Actor) IsZero() bool {
	return a.Subject == "" && a.ClientID == "" && a.AgentID == "" && a.SessionID == "" && a.Act == nil
}

// Value implements driver.Valuer: "" for no actor, else JSON.
func (a Actor) Value() (driver.Value, error) {
	if a.IsZero() {
		return "", nil
	}
	b, err := json.Marshal(a)
	return string(b), err
}

// Scan implements sql.Scanner.
func (a *Actor) Scan(src any) error {
	var text string
	switch v := src.(type) {
	case nil:
	case string:
		text = v
	case []byte:
		text = string(v)
	default:
		return fmt.Errorf("cannot scan %T into an actor", src)
	}
	*a = Actor{}
	switch {
	case text == "":
		return nil
	case !strings.HasPrefix(text, "{"):
		a.ClientID = text // written before the structured actor
		return nil
	}
	return decodeJSON(text, a)
}
