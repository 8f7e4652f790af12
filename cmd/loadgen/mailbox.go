package main

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/emersion/go-smtp"
)

// mailbox is an SMTP server on 127.0.0.1 that the server under test sends
// its e-mail to (IDENTITYD_SMTP_URL): it reads the sign-in code out of each
// message and hands it on, per recipient, on codes. Messages without a code
// are counted and dropped.
type mailbox struct {
	url   string // IDENTITYD_SMTP_URL for it
	srv   *smtp.Server
	codes chan mailedCode

	received   atomic.Int64 // codes handed on
	unreadable atomic.Int64 // messages without a code, or that did not parse
	overflow   atomic.Int64 // codes dropped because nobody read codes
}

// mailedCode is a sign-in code as e-mailed to a person.
type mailedCode struct{ email, code string }

// mailboxCapacity bounds the codes waiting to be read.
const mailboxCapacity = 1 << 16

// startMailbox listens on a free loopback port.
func startMailbox() (*mailbox, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	box := &mailbox{codes: make(chan mailedCode, mailboxCapacity)}
	srv := smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) { return &mailSession{box: box}, nil }))
	srv.Domain = "localhost"
	srv.ReadTimeout, srv.WriteTimeout = 10*time.Second, 10*time.Second
	srv.MaxMessageBytes = 1 << 20
	srv.MaxRecipients = 10
	srv.ErrorLog = log.New(io.Discard, "", 0)
	go func() { _ = srv.Serve(l) }()
	box.srv = srv
	box.url = "smtp://" + l.Addr().String() + "?starttls=off"
	return box, nil
}

func (b *mailbox) close() { _ = b.srv.Close() }

// env is what the server needs to send here.
func (b *mailbox) env() []string {
	return []string{"IDENTITYD_SMTP_URL=" + b.url, "IDENTITYD_MAIL_FROM=identityd bench <noreply@bench.example>"}
}

type mailSession struct {
	box *mailbox
	to  []string
}

func (s *mailSession) Mail(string, *smtp.MailOptions) error { return nil }

func (s *mailSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.to = append(s.to, strings.ToLower(to))
	return nil
}

func (s *mailSession) Data(r io.Reader) error {
	raw, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	code, err := codeIn(raw)
	if err != nil {
		s.box.unreadable.Add(1)
		return nil // accepted: a retry would not make it readable
	}
	for _, to := range s.to {
		select {
		case s.box.codes <- mailedCode{to, code}:
			s.box.received.Add(1)
		default:
			s.box.overflow.Add(1)
		}
	}
	return nil
}

func (s *mailSession) Reset()        { s.to = nil }
func (s *mailSession) Logout() error { return nil }

// mailedOTP is the code on a line of its own in the text part.
var mailedOTP = regexp.MustCompile(`(?m)^\s*(\d{6})\s*$`)

// codeIn finds the 6-digit code in a message's text/plain part (alone, or
// beside an HTML part in a multipart message).
func codeIn(raw []byte) (string, error) {
	msg, err := mail.ReadMessage(bytes.NewReader(raw))
	if err != nil {
		return "", err
	}
	text, err := plainText(msg.Header.Get("Content-Type"), msg.Header.Get("Content-Transfer-Encoding"), msg.Body)
	if err != nil {
		return "", err
	}
	m := mailedOTP.FindStringSubmatch(text)
	if m == nil {
		return "", errors.New("no code in the message")
	}
	return m[1], nil
}

// plainText is the text/plain content of a body of the given type.
func plainText(contentType, cte string, body io.Reader) (string, error) {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return "", fmt.Errorf("Content-Type %q: %w", contentType, err)
	}
	if strings.HasPrefix(mt, "multipart/") {
		mr := multipart.NewReader(body, params["boundary"])
		for {
			p, err := mr.NextRawPart()
			if err != nil {
				return "", fmt.Errorf("no text/plain part: %w", err)
			}
			if text, err := plainText(p.Header.Get("Content-Type"), p.Header.Get("Content-Transfer-Encoding"), p); err == nil {
				return text, nil
			}
		}
	}
	if mt != "text/plain" {
		return "", errors.New("not text/plain")
	}
	switch strings.ToLower(cte) {
	case "quoted-printable":
		body = quotedprintable.NewReader(body)
	case "base64":
		body = base64.NewDecoder(base64.StdEncoding, body)
	}
	b, err := io.ReadAll(io.LimitReader(body, 1<<20))
	return string(b), err
}
