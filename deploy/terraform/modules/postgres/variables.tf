variable "name" {
  description = "Identifier prefix of the database instance."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets the database may live in (at least two AZs)."
  type        = list(string)
}

variable "security_group_id" {
  description = "The database's security group (5432 from kiln's instances only)."
  type        = string
}

variable "kms_key_arn" {
  description = "The key the storage, the master password secret and Performance Insights are encrypted with."
  type        = string
}

variable "engine_version" {
  description = "Postgres major version; minor versions are upgraded in the maintenance window."
  type        = string
}

variable "instance_class" {
  description = "RDS instance class."
  type        = string
}

variable "allocated_storage_gb" {
  description = "Initial storage; grows by itself up to max_allocated_storage_gb."
  type        = number
}

variable "max_allocated_storage_gb" {
  description = "Ceiling of storage autoscaling."
  type        = number
}

variable "multi_az" {
  description = "A synchronous standby in another AZ."
  type        = bool
}

variable "backup_retention_days" {
  description = "Days of automated backups and point-in-time recovery."
  type        = number
}

variable "iam_database_authentication" {
  description = "Also accept IAM authentication tokens (kiln itself logs in with the master password from Secrets Manager)."
  type        = bool
}

variable "deletion_protection" {
  description = "Refuse to delete the database (turn off, apply, then destroy)."
  type        = bool
}
