"""Paper B: evolutionary mixture-of-LoRA (adapter pool, routers, fitness scopes, lifecycle) and its
synthetic sandbox."""
