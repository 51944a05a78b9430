output "address" {
  description = "The database's host name."
  value       = aws_db_instance.this.address
}

output "port" {
  description = "The database's port."
  value       = aws_db_instance.this.port
}

output "database" {
  description = "The database kiln uses."
  value       = aws_db_instance.this.db_name
}

output "username" {
  description = "The master user kiln logs in as."
  value       = aws_db_instance.this.username
}

output "master_user_secret_arn" {
  description = "The Secrets Manager secret (JSON with username and password) RDS keeps the master password in."
  value       = aws_db_instance.this.master_user_secret[0].secret_arn
}

output "resource_id" {
  description = "The instance's resource id (for rds-db:connect policies when IAM authentication is on)."
  value       = aws_db_instance.this.resource_id
}
