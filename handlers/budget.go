package handlers

import (
	"context"
	"time"

	"github.com/ulule/limiter/v3"
	"github.com/ulule/limiter/v3/drivers/store/memory"
)

// budget counts events per key in one-minute windows, in this process's
// memory, whatever IDENTITYD_RATE_LIMITS says: it bounds what an
// unauthenticated caller can make identityd write (such as audit entries),
// which is integrity, not a rate limit an operator turns off. Keys must be
// bounded by the caller (an address, not a claimed id).
type budget struct{ limiter *limiter.Limiter }

func newBudget(perMinute int64) *budget {
	store := memory.NewStoreWithOptions(limiter.StoreOptions{Prefix: "budget", CleanUpInterval: time.Minute})
	return &budget{limiter.New(store, limiter.Rate{Period: time.Minute, Limit: perMinute})}
}

// allow counts one event for key and tells whether it is within budget.
func (b *budget) allow(ctx context.Context, key string) bool {
	c, err := b.limiter.Get(ctx, key)
	return err == nil && !c.Reached
}

// refusalAudit is how many unauthenticated token refusals one address may
// put on agents' audit trails a minute.
const refusalAudit = 30

// flowsPerMinute is how many sign-in flows one address may begin a minute:
// each is a stored row, and beginning one needs no credential.
const flowsPerMinute = 60
