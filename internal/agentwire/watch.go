package agentwire

// Watching a directory (OpWatch): the request's Watch says what; the
// agent answers with a Reply (an error ends the stream there), then
// sends FrameEvents frames as things change under the directory, until
// the gateway closes the stream or the watch ends, which the agent says
// with one FrameWatchEnd frame before it closes the stream.

// OpWatch watches a directory (Request.Watch): Reply, then frames.
const OpWatch = "fs.watch"

// A watcher is a watch the agent holds between calls, its events queued
// until they are taken (envd's CreateWatcher, GetWatcherEvents and
// RemoveWatcher): it outlives the connection that made it, so it
// survives a gateway restart, until it is removed, ends and is read to
// its end, or is not read for the agent's idle bound.
const (
	OpWatcherCreate = "fs.watcher.create" // Watch → Watcher (its id)
	OpWatcherEvents = "fs.watcher.events" // ID → Events, or WatchEnd once it ended and all was taken
	OpWatcherRemove = "fs.watcher.remove" // ID
)

// WatcherPrefix starts a watcher's id, followed by WatcherHex lowercase
// hex characters.
const (
	WatcherPrefix = "wch-"
	WatcherHex    = 16
)

// WatchRequest is what OpWatch watches.
type WatchRequest struct {
	Path string `json:"path"` // absolute, a directory
	// Recursive watches the directories under Path too, as they appear.
	Recursive bool `json:"recursive,omitempty"`
}

// The frames of a watch stream (agent to gateway).
const (
	FrameEvents   byte = 'v' // a JSON array of WatchEvent, at most MaxWatchBatch
	FrameWatchEnd byte = 'V' // a JSON WatchEnd; the stream ends after it
)

// The operations of a WatchEvent: fsnotify's names for inotify's events,
// which are E2B's event types.
const (
	WatchCreate = "create" // IN_CREATE, IN_MOVED_TO
	WatchWrite  = "write"  // IN_MODIFY
	WatchRemove = "remove" // IN_DELETE
	WatchRename = "rename" // IN_MOVED_FROM
	WatchChmod  = "chmod"  // IN_ATTRIB
)

// WatchEvent is one change under a watched directory.
type WatchEvent struct {
	// Name is the path of what changed relative to the watched
	// directory ("sub/f.txt"), never absolute and never with "..".
	Name string `json:"name"`
	Op   string `json:"op"` // one of the Watch* operations
}

// WatchEnd is why a watch ended (the agent's side): Error and Kind as a
// Reply carries them. Kind "too_many" is an overflow (events came faster
// than the gateway took them, or the kernel's queue overflowed) or a cap
// on watched directories; "not_found" the watched directory was removed
// or moved away.
type WatchEnd struct {
	Error string `json:"error"`
	Kind  string `json:"kind,omitempty"`
}

// MaxWatchBatch is the most events one FrameEvents frame carries.
const MaxWatchBatch = 256
