package handlers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
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
