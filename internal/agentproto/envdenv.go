package agentproto

// The sandbox env the control plane sets for the E2B face (docs/E2B.md):
// EnvdUserEnv and EnvdWorkdirEnv are the template's default user and
// working directory, which envd uses when a request names none;
// EnvdTemplateEnv is E2B's E2B_TEMPLATE_ID, visible to the sandbox's
// processes like E2B's.
const (
	EnvdUserEnv     = "MOAT_ENVD_USER"
	EnvdWorkdirEnv  = "MOAT_ENVD_WORKDIR"
	EnvdTemplateEnv = "E2B_TEMPLATE_ID"
)
