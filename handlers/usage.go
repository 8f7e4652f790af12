package handlers

import (
	"errors"
	"net/http"
	"time"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/authz"
	"github.com/identityd/identityd/extensions/usage"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// GET /api/v1/m2m/usage?serviceAccountId=&applicationId=&granularity=&from=&to=
// (issue 18): a service account's requests (or, with applicationId, the
// API-key validations of an application's keys) per minute or per UTC day,
// with the total. An admin token reads any; analytics:read reads one's own
// account, and the applications one's account is granted.
func (a *api) usageReport(w http.ResponseWriter, r *http.Request) {
	ctx, q := r.Context(), r.URL.Query()
	p := principalFrom(ctx)
	admin := p.HasScope(oauth.ScopeAdmin)
	g, from, to, err := usage.ParseWindow(q.Get("granularity"), q.Get("from"), q.Get("to"), time.Now())
	if err != nil {
		writeError(w, r, err)
		return
	}
	subject := map[string]any{}
	var query usage.Query
	var sa *persistence.ServiceAccount
	switch appID, saID := q.Get("applicationId"), q.Get("serviceAccountId"); {
	case appID != "" && saID != "":
		var v extensions.ValidationError
		v.Add("applicationId", "give applicationId or serviceAccountId, not both")
		writeError(w, r, v.Err())
		return
	case appID != "":
		app, err := a.applications.Get(ctx, appID)
		if err == nil && a.authz != nil {
			c := authz.Caller{Admin: admin}
			if p.Client.Kind == persistence.KindServiceAccount && p.ForItself() {
				c.ServiceAccountID = p.Client.RecordID
			}
			err = a.authz.Admit(ctx, app.ID, c)
		} else if err == nil && !admin {
			err = authz.NotGranted(app.ID)
		}
		if errors.Is(err, persistence.ErrNotFound) && !admin {
			err = authz.NotGranted(appID) // as the guard answers: ids are not probed
		}
		if err != nil {
			writeError(w, r, err)
			return
		}
		subject["type"], subject["id"] = "application", app.ID
		query = usage.Query{Kind: persistence.UsageApplication, ID: app.ID}
	default:
		own := p.Client.Kind == persistence.KindServiceAccount && p.ForItself()
		switch {
		case saID == "" && !own:
			var v extensions.ValidationError
			v.Add("serviceAccountId", "is required: the caller is not a service account")
			writeError(w, r, v.Err())
			return
		case saID == "":
			saID = p.Client.RecordID
		case !admin && !(own && saID == p.Client.RecordID):
			writeError(w, r, newError(http.StatusForbidden, "forbidden", "Another service account's usage needs an admin token.", map[string]any{"serviceAccountId": saID}))
			return
		}
		if sa, err = a.serviceAccounts.Get(ctx, saID); err != nil {
			writeError(w, r, err)
			return
		}
		subject["type"], subject["id"] = "serviceAccount", sa.ID
		query = usage.Query{Kind: persistence.UsageServiceAccount, ID: sa.ID}
	}
	query.Granularity, query.From, query.To = g, from, to
	rep, err := a.usage.Report(ctx, query)
	if err != nil {
		writeError(w, r, err)
		return
	}
	series := make([]map[string]any, len(rep.Series))
	for i, pt := range rep.Series {
		series[i] = map[string]any{"start": isoTime(pt.Start), "requests": pt.Requests}
	}
	out := map[string]any{"subject": subject, "granularity": g, "from": isoTime(from), "to": isoTime(to),
		"series": series, "total": rep.Total}
	if sa != nil {
		out["tier"] = a.tierOfAccount(sa)
	}
	writeJSON(w, http.StatusOK, out)
}
