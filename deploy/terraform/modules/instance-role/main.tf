# An EC2 instance role and profile: SSM Session Manager (the only way in: no SSH) plus the one
# inline policy the caller gives, which says what this kind of instance may touch.
variable "name" {
  description = "Name prefix of the role and its profile."
  type        = string
}

variable "policy_json" {
  description = "The role's inline policy (least privilege: only what this kind of instance uses); null for none."
  type        = string
  default     = null
}

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "this" {
  name_prefix        = "${var.name}-"
  assume_role_policy = data.aws_iam_policy_document.assume.json
}

resource "aws_iam_role_policy_attachment" "ssm" {
  role       = aws_iam_role.this.name
  policy_arn = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
}

resource "aws_iam_role_policy" "this" {
  count  = var.policy_json == null ? 0 : 1
  name   = "kiln"
  role   = aws_iam_role.this.id
  policy = var.policy_json
}

resource "aws_iam_instance_profile" "this" {
  name_prefix = "${var.name}-"
  role        = aws_iam_role.this.name
}

output "profile_name" {
  description = "The instance profile's name."
  value       = aws_iam_instance_profile.this.name
}

output "role_arn" {
  description = "The role's ARN."
  value       = aws_iam_role.this.arn
}
