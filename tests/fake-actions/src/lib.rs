//! A fake of the GitHub Actions service.
