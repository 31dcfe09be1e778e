//! The templates service has no settings of its own: the kit's (`SANDMESH_NATS_URL`, …).

use kit::config::{ConfigError, ConfigReader, EnvSource};
use kit::KitConfig;

#[derive(Debug, Clone)]
pub struct TemplatesConfig {
    pub kit: KitConfig,
}

impl TemplatesConfig {
    pub fn from_env(source: &dyn EnvSource) -> Result<Self, ConfigError> {
        let mut r = ConfigReader::new(source);
        let kit = KitConfig::from_reader(&mut r);
        r.finish()?;
        Ok(Self { kit })
    }

    pub fn for_url(nats_url: &str) -> Self {
        Self {
            kit: KitConfig::for_url(nats_url),
        }
    }
}
