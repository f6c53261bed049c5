package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestSetNetwork(t *testing.T) {
	var gotBody string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut || r.URL.Path != "/v1/sandboxes/sbx-1/network" || r.Header.Get("X-Sandbox-Lease") != "tok" {
			http.Error(w, "wrong request "+r.Method+" "+r.URL.Path, http.StatusTeapot)
			return
		}
		b, _ := io.ReadAll(r.Body)
		gotBody = string(b)
		var in struct{ Egress json.RawMessage }
		_ = json.Unmarshal(b, &in)
		if string(in.Egress) == `"bad"` {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"status":400,"code":"invalid","detail":"egress: bad"}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"sandbox_id":"sbx-1","state":"running"}`)
	}))
	defer srv.Close()
	c, err := New(srv.URL, "tok", srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.SetNetwork(context.Background(), "sbx-1", map[string][]string{"allow": {"a.test"}})
	if err != nil || info.SandboxID != "sbx-1" {
		t.Fatalf("SetNetwork: %+v %v", info, err)
	}
	if gotBody != `{"egress":{"allow":["a.test"]}}` {
		t.Errorf("body %s", gotBody)
	}
	_, err = c.SetNetwork(context.Background(), "sbx-1", "bad")
	var e *Error
	if !errors.As(err, &e) || e.Status != 400 || e.Code != "invalid" {
		t.Errorf("bad policy: %v", err)
	}
}
