output "launch_template_name" {
  description = "The pool's launch template, by name (the provisioner's `launch-template`; it launches its $Default version)."
  value       = aws_launch_template.this.name
}

output "launch_template_id" {
  description = "The pool's launch template."
  value       = aws_launch_template.this.id
}

output "launch_template_arn" {
  description = "The pool's launch template's ARN (the provisioner's role may launch from it)."
  value       = aws_launch_template.this.arn
}

output "placement_group_name" {
  description = "The pool's cluster placement group for its gangs, by name (the provisioner's `placement-group`), or null without cluster_placement."
  value       = one(aws_placement_group.gangs[*].name)
}

output "role_arn" {
  description = "The pool's IAM role (the provisioner's role may pass it to EC2)."
  value       = module.role.role_arn
}
