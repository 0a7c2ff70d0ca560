//! Everything in hapwright that talks to HAProxy: the configuration tokenizer and
//! model, the two-phase validator, the deployment scheduler and the drivers that apply
//! a rendered configuration to HAProxy instances.
