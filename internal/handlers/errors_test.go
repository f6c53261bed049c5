package handlers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/sandgate/sandgate/internal/providers"
)

// TestClientGoneIsNoInternalError: an operation cut short because its
// client went away answers 499 and logs no internal error; the same
// error with the client still there is one.
func TestClientGoneIsNoInternalError(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := fmt.Errorf("start process in sbx-1: %w", context.Canceled)
	if p := problemOf(ctx, log, err, "POST /v1/sandboxes/sbx-1/pty"); p.Status != statusClientClosed || p.Code != "client_closed" {
		t.Errorf("client gone: %d %s", p.Status, p.Code)
	}
	if logs.Len() != 0 {
		t.Errorf("logged at info or above: %s", logs.String())
	}
	if p := problemOf(context.Background(), log, errors.New("boom"), "GET /x"); p.Status != 500 || !bytes.Contains(logs.Bytes(), []byte("internal error")) {
		t.Errorf("a bug: %d, log %q", p.Status, logs.String())
	}
}

// TestUnavailableLogsItsCause: a 503's detail names what failed and not
// the backend's words; the log keeps those, with the request's id.
func TestUnavailableLogsItsCause(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	err := providers.Wrap(providers.ErrUnavailable, errors.New("etcdserver: leader changed"), "the shared state store")
	p := problemOf(context.Background(), log, err, "POST /v1/sandboxes")
	if p.Status != 503 || p.Detail != "the shared state store" {
		t.Errorf("answer: %d %q", p.Status, p.Detail)
	}
	if !bytes.Contains(logs.Bytes(), []byte("etcdserver: leader changed")) {
		t.Errorf("the cause is not in the log: %q", logs.String())
	}
	logs.Reset()
	if p := problemOf(context.Background(), log, providers.Errorf(providers.ErrNotFound, "sandbox x not found"), "GET /x"); p.Status != 404 || logs.Len() != 0 {
		t.Errorf("a 404 logged: %d %q", p.Status, logs.String())
	}
}
