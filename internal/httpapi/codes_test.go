package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/web"
)

// TestWireCodesAtTheEdge: backends and the image store return classes and
// reasons only; the edge answers them with the Lifecycle API's codes and
// the errors' public messages.
func TestWireCodesAtTheEdge(t *testing.T) {
	_, badRef := image.NormalizeName("")
	spec := runtime.Spec{ID: "Bad"}
	for i, tc := range []struct {
		err        error
		status     int
		code, want string
	}{
		{badRef, 400, "IMAGE::INVALID_REFERENCE", "image reference is empty"},
		{fmt.Errorf("create: %w", spec.Validate()), 400, "SANDBOX::INVALID_PARAMETER", `invalid sandbox id "Bad"`},
		{errdefs.WithPublic(fmt.Errorf("x: %w: %w", image.ErrUnknownImage, errdefs.ErrNotFound), "", "image \"a\" not found"), 404, "IMAGE::NOT_FOUND", `image "a" not found`},
		{errdefs.WithPublic(fmt.Errorf("x: %w: %w", runtime.ErrCheckpointMissing, errdefs.ErrFailedPrecondition), "", "gone"), 409, "SNAPSHOT::IMAGE_MISSING", "gone"},
		{errdefs.Newf(errdefs.ErrNotImplemented, "cannot"), 501, "SANDBOX::API_NOT_SUPPORTED", "cannot"},
		// A code chosen by the service layer wins over the class.
		{errdefs.Invalid("SANDBOX::INVALID_METADATA_LABEL", "m"), 400, "SANDBOX::INVALID_METADATA_LABEL", "m"},
	} {
		a := &web.Adapter{Codes: codeOf}
		rec := httptest.NewRecorder()
		a.WriteError(rec, httptest.NewRequest(http.MethodGet, "/", nil), tc.err)
		var body web.ErrorBody
		json.Unmarshal(rec.Body.Bytes(), &body)
		if rec.Code != tc.status || body.Code != tc.code || body.Message != tc.want {
			t.Errorf("%d: %v -> %d %+v; want %d %s %q", i, tc.err, rec.Code, body, tc.status, tc.code, tc.want)
		}
	}
}
