#[cfg(feature = "python")]
mod py;
