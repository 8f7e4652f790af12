package reset

import (
	_ "embed"
	"net/http"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/directory"
)

// commonPasswords are the passwords of at least 8 characters among the
// 47,023 most common ones of zxcvbn 4.4.2's frequency list (data/passwords.txt
// of the Go port github.com/trustelem/zxcvbn v1.0.1, MIT; the list is
// Dropbox's zxcvbn data, MIT, drawn from Mark Burnett's corpus of leaked
// passwords), lower-cased, one a line: 15,769 passwords. Shorter ones are
// refused by length anyway.
//
//go:embed common-passwords.txt
var commonPasswordsText string

var (
	commonOnce sync.Once
	common     map[string]struct{}
)

// commonPassword tells whether password, case folded, is on the list.
func commonPassword(password string) bool {
	commonOnce.Do(func() {
		lines := strings.Split(strings.TrimSpace(commonPasswordsText), "\n")
		common = make(map[string]struct{}, len(lines))
		for _, l := range lines {
			common[strings.TrimSpace(l)] = struct{}{}
		}
	})
	_, ok := common[strings.ToLower(password)]
	return ok
}

// maxPasswordLength bounds the work one request can ask of argon2 (as the
// directory does).
const maxPasswordLength = 1024

// weak refuses a password that may not be chosen; why says which rule.
func weak(why string) error {
	return extensions.NewError(http.StatusBadRequest, "weak_password", why, map[string]any{"field": "newPassword"})
}

// CheckPassword refuses a new password that is too short (under
// directory.MinPasswordLength characters), the account's e-mail address or
// its local part, or one of the common breached passwords shipped with the
// binary (weak_password); a password too long to hash is invalid_request.
func CheckPassword(password, email string) error {
	if len(password) > maxPasswordLength {
		return extensions.NewError(http.StatusBadRequest, "invalid_request", "The password may have at most 1024 characters.",
			map[string]any{"field": "newPassword"})
	}
	if utf8.RuneCountInString(password) < directory.MinPasswordLength {
		return weak("Choose a password of at least 8 characters.")
	}
	folded := strings.ToLower(strings.TrimSpace(password))
	email = strings.ToLower(strings.TrimSpace(email))
	local, _, _ := strings.Cut(email, "@")
	if folded == email || (local != "" && folded == local) {
		return weak("Choose a password other than your e-mail address.")
	}
	if commonPassword(password) {
		return weak("This password is among the most common ones, which attackers try first. Choose another.")
	}
	return nil
}
