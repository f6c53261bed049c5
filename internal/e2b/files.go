package e2b

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sandgate/sandgate/internal/e2b/envd/filesystem"
	"github.com/sandgate/sandgate/internal/e2b/envd/filesystem/filesystemconnect"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/sandbox"
)

// The data plane's files: envd's /files routes and its filesystem
// service, over the service's streaming file calls. Moves, removes and
// directories are made by a command in the sandbox, with the sandbox's
// own rights, never by the gateway on the sandbox's paths.

// fileTarget is target() for the /files routes, whose user comes as the
// username query parameter. Signed URLs (signature=) are not served.
func (s *server) fileTarget(r *http.Request) (target, error) {
	if r.URL.Query().Get("signature") != "" {
		return target{}, providers.Errorf(providers.ErrUnsupported, "signed file URLs are not supported by sandgate's E2B face yet")
	}
	t, err := s.target(r.Context(), r.Header)
	if err != nil {
		return target{}, err
	}
	if u := r.URL.Query().Get("username"); u != "" {
		t.user = u
	}
	return t, nil
}

// download answers GET /files?path=: the file's bytes, streamed.
func (s *server) download(w http.ResponseWriter, r *http.Request) {
	t, err := s.fileTarget(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p := r.URL.Query().Get("path")
	if p == "" {
		s.writeError(w, r, providers.InvalidFields{{Field: "path", Message: "is required"}})
		return
	}
	rc, size, err := s.svc.ReadFile(r.Context(), t.c, t.id, p, 0)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(p)}))
	w.Header().Set("Vary", "Accept-Encoding")
	if !gzipOnly(r.Header.Get("Accept-Encoding")) {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		w.WriteHeader(http.StatusOK)
		io.Copy(w, rc)
		return
	}
	w.Header().Set("Content-Encoding", "gzip")
	w.WriteHeader(http.StatusOK)
	zw, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if _, err := io.Copy(zw, rc); err == nil {
		zw.Close() // an error ends the body short, without the trailer
	}
}

// gzipOnly reports whether an Accept-Encoding asks for gzip and no other
// coding: what the SDKs send for read(..., {gzip: true}). A list of
// several (an HTTP library's default "gzip, deflate, br") gets the file
// as it is, which HTTP allows, so that a large file is not compressed
// unasked.
func gzipOnly(accept string) bool {
	coding, params, _ := strings.Cut(strings.TrimSpace(accept), ";")
	if !strings.EqualFold(strings.TrimSpace(coding), "gzip") || strings.Contains(coding, ",") {
		return false
	}
	q := strings.ReplaceAll(params, " ", "")
	return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
}

// writeWhole writes body to p through a temporary file beside it, moved
// over p once body has been read to its end: a gzip body found corrupt
// part way leaves p as it was. It returns p's absolute path.
func (s *server) writeWhole(ctx context.Context, t target, p string, body io.Reader) (string, error) {
	tmp := path.Join(path.Dir(p), ".sandgate-upload-"+strconv.FormatUint(rand.Uint64(), 36))
	absTmp, _, err := s.svc.WriteFile(ctx, t.c, t.id, tmp, body)
	if providers.Kind(err) == providers.ErrInvalid {
		err = providers.Wrap(providers.ErrInvalid, err, p+": the body is not valid gzip")
	}
	abs := path.Join(path.Dir(absTmp), path.Base(p))
	fs := &filesystemServer{s: s}
	if err == nil {
		var rc int
		var msg string
		rc, msg, err = fs.run(ctx, t, "mv -f -- "+shellQuote(absTmp)+" "+shellQuote(abs))
		if err == nil && rc != 0 {
			err = providers.Errorf(providers.ErrInvalid, "write %s: %s", p, msg)
		}
	}
	if err != nil {
		// A relative tmp is relative to the workdir, as the command's
		// working directory is.
		fs.run(context.WithoutCancel(ctx), t, "rm -f -- "+shellQuote(tmp))
	}
	return abs, err
}

// gunzipBody is a gzip upload's decompressed body: a corrupt stream is
// ErrInvalid, not a failure of the sandbox.
type gunzipBody struct{ zr *gzip.Reader }

func (b gunzipBody) Read(p []byte) (int, error) {
	n, err := b.zr.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = providers.Wrap(providers.ErrInvalid, err, "the body is not valid gzip")
	}
	return n, err
}

// writtenEntry is a written file as envd's upload describes it.
type writtenEntry struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// upload answers POST /files: a raw body (application/octet-stream) to
// path=, or a multipart form whose "file" parts go to path= or, without
// it, to each part's file name. Parent directories are made.
func (s *server) upload(w http.ResponseWriter, r *http.Request) {
	t, err := s.fileTarget(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	body := io.Reader(r.Body)
	switch ce := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); ce {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			s.writeError(w, r, providers.InvalidFields{{Field: "body", Message: "is not valid gzip (Content-Encoding: gzip): " + err.Error()}})
			return
		}
		defer zr.Close()
		body = gunzipBody{zr}
	default:
		s.writeError(w, r, providers.Errorf(providers.ErrUnsupported, "Content-Encoding %q is not supported by sandgate's E2B face (gzip is)", ce))
		return
	}
	for k := range r.Header {
		if strings.HasPrefix(strings.ToLower(k), "x-metadata-") {
			s.writeError(w, r, providers.Errorf(providers.ErrUnsupported, "file metadata (%s) is not supported by sandgate's E2B face yet", k))
			return
		}
	}
	p := r.URL.Query().Get("path")
	var out []writtenEntry
	write := func(dst string, body io.Reader) error {
		if dst == "" {
			return providers.InvalidFields{{Field: "path", Message: "is required (the query's path or the part's file name)"}}
		}
		var abs string
		var err error
		if _, gz := body.(gunzipBody); gz {
			abs, err = s.writeWhole(r.Context(), t, dst, body)
		} else {
			abs, _, err = s.svc.WriteFile(r.Context(), t.c, t.id, dst, body)
		}
		if err != nil {
			return err
		}
		out = append(out, writtenEntry{Name: path.Base(abs), Type: "file", Path: abs})
		return nil
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case mt == "multipart/form-data":
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				s.writeError(w, r, providers.InvalidFields{{Field: "body", Message: "is not a valid multipart form: " + err.Error()}})
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			dst := p
			if dst == "" {
				dst = part.FileName()
			}
			err = write(dst, part)
			part.Close()
			if err != nil {
				s.writeError(w, r, err)
				return
			}
		}
		if len(out) == 0 {
			s.writeError(w, r, providers.InvalidFields{{Field: "file", Message: "the form has no file part"}})
			return
		}
	default:
		if err := write(p, body); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, out)
}

type filesystemServer struct {
	filesystemconnect.UnimplementedFilesystemHandler
	s *server
}

// entryOf is fi, found at abs, as envd's EntryInfo.
func entryOf(abs string, fi providers.FileInfo) *filesystem.EntryInfo {
	e := &filesystem.EntryInfo{
		Name: path.Base(abs), Path: abs, Size: fi.Size,
		Mode: uint32(fi.Mode), Permissions: fi.Mode.String(),
		ModifiedTime: timestamppb.New(fi.ModTime),
	}
	switch fi.Type {
	case providers.FileRegular:
		e.Type = filesystem.FileType_FILE_TYPE_FILE
	case providers.FileDir:
		e.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
		e.Mode |= uint32(fs.ModeDir)
		e.Permissions = (fi.Mode | fs.ModeDir).String()
	case providers.FileSymlink:
		e.Type = filesystem.FileType_FILE_TYPE_SYMLINK
		target := fi.Target
		e.SymlinkTarget = &target
	}
	return e
}

func (f *filesystemServer) stat(ctx context.Context, t target, p string) (*filesystem.EntryInfo, error) {
	abs, fi, err := f.s.svc.StatFile(ctx, t.c, t.id, p)
	if err != nil {
		return nil, err
	}
	return entryOf(abs, fi), nil
}

func (f *filesystemServer) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	t, err := f.s.target(ctx, req.Header())
	if err != nil {
		return nil, f.s.connectErr(err)
	}
	e, err := f.stat(ctx, t, req.Msg.Path)
	if err != nil {
		return nil, f.s.connectErr(err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

// maxListDepth bounds ListDir's depth.
const maxListDepth = 32

// ListDir lists a directory to depth levels (0 and 1: its entries).
func (f *filesystemServer) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	t, err := f.s.target(ctx, req.Header())
	if err != nil {
		return nil, f.s.connectErr(err)
	}
	depth := int(max(req.Msg.Depth, 1))
	if depth > maxListDepth {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("depth must be at most "+strconv.Itoa(maxListDepth)))
	}
	res := &filesystem.ListDirResponse{}
	dirs := []string{req.Msg.Path}
	for level := 1; level <= depth && len(dirs) > 0; level++ {
		var next []string
		for _, d := range dirs {
			abs, entries, _, err := f.s.svc.ListDir(ctx, t.c, t.id, d)
			if err != nil {
				if level > 1 && providers.Kind(err) == providers.ErrNotFound {
					continue // gone meanwhile
				}
				return nil, f.s.connectErr(err)
			}
			for _, fi := range entries {
				e := entryOf(path.Join(abs, fi.Name), fi)
				res.Entries = append(res.Entries, e)
				if fi.Type == providers.FileDir {
					next = append(next, e.Path)
				}
			}
		}
		dirs = next
	}
	return connect.NewResponse(res), nil
}

// run runs script in the sandbox as t's user and returns its exit code;
// its stderr is the message of a failure.
func (f *filesystemServer) run(ctx context.Context, t target, script string) (int, string, error) {
	res, err := f.s.svc.Exec(ctx, t.c, t.id, sandbox.ExecRequest{Command: script, User: t.user, KillOnDisconnect: true})
	if err != nil {
		return 0, "", err
	}
	defer res.Release()
	if res.ErrorType != "" {
		return 0, "", providers.Errorf(providers.ErrUnavailable, "the sandbox did not run the operation: %s", strings.TrimSpace(string(res.Stderr)))
	}
	return res.ReturnCode, strings.TrimSpace(string(res.Stderr)), nil
}

// Exit codes of the scripts below.
const (
	exitMissing = 3
	exitExists  = 4
)

func (f *filesystemServer) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	t, err := f.s.target(ctx, req.Header())
	if err != nil {
		return nil, f.s.connectErr(err)
	}
	p := req.Msg.Path
	if p == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("path must not be empty"))
	}
	q := shellQuote(p)
	rc, msg, err := f.run(ctx, t, "if [ -e "+q+" ] || [ -L "+q+" ]; then exit 4; fi; mkdir -p -- "+q)
	switch {
	case err != nil:
		return nil, f.s.connectErr(err)
	case rc == exitExists:
		return nil, connect.NewError(connect.CodeAlreadyExists, errors.New(p+" already exists"))
	case rc != 0:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("mkdir "+p+": "+msg))
	}
	e, err := f.stat(ctx, t, p)
	if err != nil {
		return nil, f.s.connectErr(err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

func (f *filesystemServer) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	t, err := f.s.target(ctx, req.Header())
	if err != nil {
		return nil, f.s.connectErr(err)
	}
	src, dst := req.Msg.Source, req.Msg.Destination
	if src == "" || dst == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("source and destination must not be empty"))
	}
	qs, qd := shellQuote(src), shellQuote(dst)
	rc, msg, err := f.run(ctx, t, "if [ ! -e "+qs+" ] && [ ! -L "+qs+" ]; then exit 3; fi; mkdir -p -- \"$(dirname -- "+qd+")\" && mv -f -- "+qs+" "+qd)
	switch {
	case err != nil:
		return nil, f.s.connectErr(err)
	case rc == exitMissing:
		return nil, connect.NewError(connect.CodeNotFound, errors.New(src+" does not exist"))
	case rc != 0:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("move "+src+" to "+dst+": "+msg))
	}
	e, err := f.stat(ctx, t, dst)
	if err != nil {
		return nil, f.s.connectErr(err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

func (f *filesystemServer) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	t, err := f.s.target(ctx, req.Header())
	if err != nil {
		return nil, f.s.connectErr(err)
	}
	p := req.Msg.Path
	if p == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("path must not be empty"))
	}
	q := shellQuote(p)
	rc, msg, err := f.run(ctx, t, "if [ ! -e "+q+" ] && [ ! -L "+q+" ]; then exit 3; fi; rm -rf -- "+q)
	switch {
	case err != nil:
		return nil, f.s.connectErr(err)
	case rc == exitMissing:
		return nil, connect.NewError(connect.CodeNotFound, errors.New(p+" does not exist"))
	case rc != 0:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("remove "+p+": "+msg))
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}
