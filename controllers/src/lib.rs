//! controller-manager: groundskeeper's cluster-wide controllers, one active replica at a time.

pub mod context;
pub mod leader;
pub mod manager;
pub mod pacing;
pub mod plugin;
pub mod podgc;
pub mod servicecidr;
pub mod sysctl;
pub mod uninstall;
pub mod workqueue;
