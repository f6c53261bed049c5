package handlers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	middleware "github.com/oapi-codegen/nethttp-middleware"

	apispec "github.com/sandgate/sandgate/api"
	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/providers"
)

// validator checks every request against the OpenAPI contract before a
// handler sees it: parameters, and JSON bodies (types, required and
// unknown fields). All problems are reported at once.
func (s *server) validator() (func(http.Handler) http.Handler, error) {
	spec, err := generatedSpec()
	if err != nil {
		return nil, err
	}
	return s.validatorFor(spec), nil
}

// wsValidator validates the routes mounted by hand (the WebSocket attach,
// a command's output),
// which the generated code's embedded spec leaves out, against the whole
// contract.
func (s *server) wsValidator() (func(http.Handler) http.Handler, error) {
	spec, err := wholeSpec()
	if err != nil {
		return nil, err
	}
	return s.validatorFor(spec), nil
}

// generatedSpec and wholeSpec parse the contract once per process: the
// parse dominates New's cost (tens of milliseconds, ten times that under
// -race), and the documents are only read once parsed.
var (
	generatedSpec = sync.OnceValues(api.GetSwagger)
	wholeSpec     = sync.OnceValues(func() (*openapi3.T, error) {
		return openapi3.NewLoader().LoadFromData(apispec.YAML)
	})
)

// validatorFor returns the contract's request validator over spec, which
// it does not modify.
func (s *server) validatorFor(spec *openapi3.T) func(http.Handler) http.Handler {
	// The middleware clears the document's Servers (DoNotValidateServers):
	// it gets a shallow copy of its own, so servers built at the same time
	// share no write. Everything below the top level is only read.
	doc := *spec
	return middleware.OapiRequestValidatorWithOptions(&doc, &middleware.Options{
		Options: openapi3filter.Options{
			MultiError: true,
			// Credentials are checked by the service, in its 401/403/404 order.
			AuthenticationFunc: openapi3filter.NoopAuthenticationFunc,
		},
		DoNotValidateServers: true,
		// The streaming upload's body is raw bytes of any size: never read it here.
		Skipper:              isStream,
		ErrorHandlerWithOpts: s.validationError,
	})
}

// validationError renders what the validator found: malformed JSON and bad
// parameters are 400, schema violations of a JSON body 422, an oversize
// body 413, a body the gateway has no room for 503, one that does not
// arrive in time 408; each problem is listed with the field it concerns.
func (s *server) validationError(ctx context.Context, err error, w http.ResponseWriter, r *http.Request, _ middleware.ErrorHandlerOpts) {
	if errors.Is(err, routers.ErrPathNotFound) {
		writeProblem(w, problem{Status: http.StatusNotFound, Code: "not_found", Detail: "no such route: " + r.Method + " " + r.URL.Path})
		return
	}
	if errors.Is(err, routers.ErrMethodNotAllowed) {
		writeProblem(w, problem{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed", Detail: r.Method + " is not allowed on " + r.URL.Path})
		return
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) || isBodyBusy(err) {
		s.refuseUnread(w, r, err)
		return
	}
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		w.Header().Set("Connection", "close")
		writeProblem(w, problem{Status: http.StatusRequestTimeout, Code: "body_timeout",
			Detail: "the request body did not arrive within " + s.bodyTimeout.String()})
		return
	}
	p := problem{Status: http.StatusBadRequest, Code: "invalid_input"}
	var errs []error
	var me openapi3.MultiError
	if errors.As(err, &me) {
		errs = me
	} else {
		errs = []error{err}
	}
	schemaOnly := true
	for _, e := range errs {
		fs, isSchema := describe(e)
		for i, f := range fs {
			if f.Field == "body" && strings.Contains(f.Message, "header Content-Type has unexpected value") {
				fs[i].Message = contentTypeHint(r.Header.Get("Content-Type"))
			}
		}
		schemaOnly = schemaOnly && isSchema
		p.Errors = append(p.Errors, fs...)
	}
	if schemaOnly {
		p.Status, p.Code = http.StatusUnprocessableEntity, "schema_violation"
	}
	msgs := make([]string, len(p.Errors))
	for i, f := range p.Errors {
		msgs[i] = f.Field + ": " + f.Message
	}
	p.Detail = strings.Join(msgs, "; ")
	writeProblem(w, p)
}

// contentTypeHint says what to send instead of the Content-Type got.
func contentTypeHint(got string) string {
	msg := fmt.Sprintf("send the JSON body with Content-Type: application/json (got %q)", got)
	if strings.HasPrefix(got, "application/x-www-form-urlencoded") {
		msg += "; curl -d sends that type unless told: add -H 'Content-Type: application/json'"
	}
	return msg
}

// describe turns one validation error into field problems and says
// whether it is a schema violation of the JSON body.
func describe(err error) ([]providers.FieldError, bool) {
	var re *openapi3filter.RequestError
	if !errors.As(err, &re) {
		return []providers.FieldError{{Field: "request", Message: err.Error()}}, false
	}
	var me openapi3.MultiError
	if re.Parameter == nil && errors.As(re.Err, &me) {
		var out []providers.FieldError
		for _, e := range me {
			if f, ok := schemaProblem(e); ok {
				out = append(out, f)
			}
		}
		if len(out) == len(me) {
			return out, true
		}
	}
	f, isSchema := describeOne(re)
	return []providers.FieldError{f}, isSchema
}

// schemaProblem describes a schema violation of the JSON body.
func schemaProblem(err error) (providers.FieldError, bool) {
	var se *openapi3.SchemaError
	if !errors.As(err, &se) {
		return providers.FieldError{}, false
	}
	field := "body"
	if ptr := se.JSONPointer(); len(ptr) > 0 {
		field += "." + strings.Join(ptr, ".")
	}
	return providers.FieldError{Field: field, Message: se.Reason}, true
}

func describeOne(re *openapi3filter.RequestError) (providers.FieldError, bool) {
	if re.Parameter != nil {
		msg := re.Reason
		var se *openapi3.SchemaError
		if errors.As(re.Err, &se) {
			msg = se.Reason
		} else if re.Err != nil {
			msg = strings.TrimSpace(msg + " " + re.Err.Error())
		}
		return providers.FieldError{Field: re.Parameter.In + "." + re.Parameter.Name, Message: msg}, false
	}
	var pe *openapi3filter.ParseError
	if errors.As(re.Err, &pe) {
		var mbe *http.MaxBytesError
		if errors.As(pe, &mbe) {
			return providers.FieldError{Field: "body", Message: "request body too large"}, false
		}
		return providers.FieldError{Field: "body", Message: "not valid JSON: " + pe.Error()}, false
	}
	if f, ok := schemaProblem(re.Err); ok {
		return f, true
	}
	msg := re.Reason
	if re.Err != nil {
		msg = re.Err.Error()
	}
	return providers.FieldError{Field: "body", Message: msg}, false
}
