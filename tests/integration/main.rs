//! One integration-test binary (faster to link than one per file). Each module is one family.

mod arriving;
mod browser;
mod browser_jobs;
mod categories;
mod connections;
mod diagnosis;
mod disk_full;
mod engines;
mod external;
mod first_hour;
mod forms;
mod hardening;
mod hostile;
mod js;
mod layering;
mod notebook;
mod python_client;
mod reader_props;
mod replay;
mod runs;
mod server;
mod simulate;
mod team;
mod truth;
mod util;
mod variants;
